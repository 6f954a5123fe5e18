"""Shared fixtures and hypothesis profiles (CI: derandomised so a red run reproduces)."""

import os

import hypothesis

hypothesis.settings.register_profile("ci", max_examples=40, deadline=None, derandomize=True,
                                     print_blob=True)
hypothesis.settings.register_profile("dev", max_examples=40, deadline=None)
hypothesis.settings.register_profile("thorough", max_examples=500, deadline=None)
hypothesis.settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE",
                                                "ci" if os.environ.get("CI") else "dev"))
