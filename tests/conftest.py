"""Test-suite settings shared by every test module.

Hypothesis profiles (``lockstep.conformance.search.register_profiles``): the suite runs
``lockstep-suite`` (derandomized, no example database, no deadline); ``deep`` is for
``python3 -m tools.conformance_search`` and ``pytest --hypothesis-profile=deep``.
"""

from hypothesis import settings

from lockstep.conformance.search import SUITE_PROFILE, register_profiles

register_profiles()
settings.load_profile(SUITE_PROFILE)
