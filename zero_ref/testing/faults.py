"""Fault injection for the failure tests: zero_ref/app/faults.py (production code, since
ZERO_REF_INJECT_FAULT is a documented switch), named here for the tests that import it."""

from zero_ref.app.faults import (  # noqa: F401
    FAULT_ENV,
    FAULT_LOG_ENV,
    KINDS,
    Fault,
    FaultHooks,
    InjectedFault,
    arm,
    inject_from_env,
)
