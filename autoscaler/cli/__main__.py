"""``python -m autoscaler.cli`` is ``slotwise``."""

from autoscaler.cli.main import main

raise SystemExit(main())
