"""Import stub for the oracle process (see tools/oracle/stubs/README.md): any attribute use fails."""


class StubbedModuleError(AttributeError):
    """AttributeError so `hasattr` probes stay False; the message says why."""


def __getattr__(name: str):
    raise StubbedModuleError(
        f"{__name__}.{name}: stubbed in the oracle process; the 12 Hz path must not use it"
    )
