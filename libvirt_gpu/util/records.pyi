# The type checker's view of records.py (mypy, `make lint`): records are
# dataclass-like (PEP 681), so a record's ``__init__``, order and frozen
# fields are checked where it is built, while records.py itself imports
# nothing of ``typing`` (the hook pays for every import).
from typing import Any, Callable, TypeVar, dataclass_transform, overload

_T = TypeVar('_T')

MISSING: Any


class FrozenRecordError(AttributeError): ...


class Field:
    name: str
    default: Any
    default_factory: Any
    compare: bool
    repr: bool

    def __init__(self, default: Any = ..., default_factory: Any = ...,
                 compare: bool = ..., repr: bool = ...) -> None: ...


def field(*, default: Any = ..., default_factory: Callable[[], Any] = ...,
          compare: bool = ..., repr: bool = ...) -> Any: ...


def fields(record_or_class: object) -> tuple[Field, ...]: ...


def is_record(obj: object) -> bool: ...


def replace(obj: _T, /, **changes: Any) -> _T: ...


def asdict(obj: object) -> Any: ...


@overload
@dataclass_transform(frozen_default=True, field_specifiers=(field,))
def record(cls: type[_T], /) -> type[_T]: ...


@overload
@dataclass_transform(frozen_default=True, field_specifiers=(field,))
def record(*, frozen: bool = ..., order: bool = ...
           ) -> Callable[[type[_T]], type[_T]]: ...
