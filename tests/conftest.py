"""Hypothesis profiles. Locally every run draws new examples (that is how the packer's differential test found
a real disagreement); CI (``.ci/run`` sets ``SLOTWISE_HYPOTHESIS_PROFILE=ci``) draws a fixed set, so a landing
is decided by the change and not by the luck of a seed."""

from __future__ import annotations

import os

from hypothesis import settings

settings.register_profile("ci", derandomize=True, database=None, print_blob=True)
settings.load_profile(os.environ.get("SLOTWISE_HYPOTHESIS_PROFILE", "default"))
