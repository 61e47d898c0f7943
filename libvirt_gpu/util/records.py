"""Records: value classes declared like dataclasses, built cheaply.

``@record`` turns a class with annotated fields into a record: an
``__init__`` taking the fields in order (defaults allowed, ``__post_init__``
called when the class has one), equality and hashing on the compared
fields, an optional order (``order=True``), a ``repr``, and, unless
``frozen=False``, no assignment after construction::

    @records.record(order=True)
    class Mdev:
        uuid: str
        type_id: str
        note: str | None = records.field(default=None, compare=False)

Why not ``dataclasses``: the qemu hook and the CLI start a process per
call, and importing ``dataclasses`` (it imports ``inspect``, which imports
``ast``, ``dis``, ``tokenize``...) plus generating six methods per class by
``exec`` cost more than everything else the hook does for a guest.  Here
one small ``exec`` builds each ``__init__`` (the method called thousands of
times in discovery) once the class has been instantiated a few times (the
first few bind their arguments without it); the other
methods are shared and read the fields through one
``operator.attrgetter``.  Annotations are never evaluated (the
modules declare ``from __future__ import annotations``), so records need no
``typing`` either.

The functions mirror their ``dataclasses`` namesakes: ``field``,
``fields``, ``replace``, ``asdict``, ``is_record``.
"""

import operator

MISSING = type('MissingType', (), {'__repr__': lambda self: 'MISSING'})()


class FrozenRecordError(AttributeError):
    """An assignment to a field of a frozen record."""


class Field(object):
    """One field of a record: its name, default (or factory of a default),
    and whether it takes part in equality/order/hash and in ``repr``."""

    __slots__ = ('name', 'default', 'default_factory', 'compare', 'repr')

    def __init__(self, default=MISSING, default_factory=MISSING,
                 compare=True, repr=True):
        if default is not MISSING and default_factory is not MISSING:
            raise ValueError('a field cannot have both a default and a '
                             'default_factory')
        self.name = None
        self.default = default
        self.default_factory = default_factory
        self.compare = compare
        self.repr = repr

    def __repr__(self):
        return 'Field(%r)' % self.name


def field(*, default=MISSING, default_factory=MISSING, compare=True,
          repr=True):
    """A field with options, as the default value of an annotated name."""
    return Field(default, default_factory, compare, repr)


def fields(record_or_class):
    """The Fields of a record (instance or class), in order."""
    try:
        return record_or_class.__record_fields__
    except AttributeError:
        raise TypeError('%r is not a record' % (record_or_class,)) from None


def is_record(obj):
    """Whether ``obj`` is a record instance or class."""
    return hasattr(obj, '__record_fields__')


def replace(obj, **changes):
    """A copy of record ``obj`` with ``changes`` (``__post_init__`` runs
    again, as for any construction)."""
    values = obj.__dict__
    for f in obj.__record_fields__:
        if f.name not in changes:
            changes[f.name] = values[f.name]
    return obj.__class__(**changes)


def asdict(obj):
    """Record ``obj`` as a dict, recursively (records in fields, lists,
    tuples and dicts are converted too)."""
    if hasattr(type(obj), '__record_fields__'):
        return {f.name: asdict(getattr(obj, f.name))
                for f in obj.__record_fields__}
    if isinstance(obj, (list, tuple)):
        return type(obj)(asdict(v) for v in obj)
    if isinstance(obj, dict):
        return {asdict(k): asdict(v) for k, v in obj.items()}
    return obj


def _collect(cls):
    """The class's Fields: inherited ones first, then its own annotated
    names in order; class attributes become the defaults."""
    found = {}
    for base in reversed(cls.__mro__[1:]):
        for f in base.__dict__.get('__record_fields__', ()):
            found[f.name] = f
    for name in cls.__dict__.get('__annotations__', {}):
        value = cls.__dict__.get(name, MISSING)
        if isinstance(value, Field):
            f = value
            if f.default is MISSING:
                delattr(cls, name)
            else:
                setattr(cls, name, f.default)
        else:
            f = Field(default=value)
        f.name = name
        found[name] = f
    result = tuple(found.values())
    seen_default = None
    for f in result:
        if f.default is not MISSING or f.default_factory is not MISSING:
            seen_default = f.name
        elif seen_default:
            raise TypeError('%s: field %r without a default follows %r, '
                            'which has one' % (cls.__name__, f.name,
                                               seen_default))
    return result


def _make_init(cls, all_fields):
    """``__init__`` of ``cls``: one function compiled for its fields, which
    stores them in the instance's ``__dict__`` (no ``__setattr__``, so it
    works for frozen records) and calls ``__post_init__`` if any."""
    names = {'__FACTORY': MISSING}
    params, body = [], []
    for f in all_fields:
        if f.default_factory is not MISSING:
            names['__factory_' + f.name] = f.default_factory
            params.append('%s=__FACTORY' % f.name)
            body.append('    d[%r] = __factory_%s() if %s is __FACTORY '
                        'else %s' % (f.name, f.name, f.name, f.name))
            continue
        if f.default is MISSING:
            params.append(f.name)
        else:
            names['__default_' + f.name] = f.default
            params.append('%s=__default_%s' % (f.name, f.name))
        body.append('    d[%r] = %s' % (f.name, f.name))
    if hasattr(cls, '__post_init__'):
        body.append('    self.__post_init__()')
    source = 'def __init__(self, %s):\n    d = self.__dict__\n%s\n' % (
        ', '.join(params), '\n'.join(body))
    if not all_fields:
        source = 'def __init__(self):\n    pass\n'
        if hasattr(cls, '__post_init__'):
            source = 'def __init__(self):\n    self.__post_init__()\n'
    exec(source, names)
    init = names['__init__']
    init.__qualname__ = '%s.__init__' % cls.__qualname__
    return init


# A record class's first instantiations bind their arguments in
# ``_bind``; the ``_COMPILE_AFTER``-th compiles its ``__init__`` (one
# ``exec``, about 0.1 ms).  A qemu hook call makes one or two of most of
# the records it uses, and its dozen compilations cost it more than all
# the bindings; discovery makes thousands of a few, which get the fast one.
_COMPILE_AFTER = 8


def _plural(n, word):
    return '%d %s%s' % (n, word, '' if n == 1 else 's')


def _names(names):
    quoted = ["'%s'" % n for n in names]
    if len(quoted) == 1:
        return quoted[0]
    if len(quoted) == 2:
        return '%s and %s' % tuple(quoted)
    return '%s, and %s' % (', '.join(quoted[:-1]), quoted[-1])


def _bind(cls, all_fields, self, args, kwargs):
    """What the compiled ``__init__`` does (``_make_init``), argument
    errors included (Python's messages, in Python's order)."""
    name = '%s.__init__()' % cls.__qualname__
    count = len(all_fields)
    given = {}
    for f, value in zip(all_fields, args):
        given[f.name] = value
    if kwargs:
        names = {f.name for f in all_fields}
        for key, value in kwargs.items():
            if key not in names:
                raise TypeError("%s got an unexpected keyword argument "
                                "'%s'" % (name, key))
            if key in given:
                raise TypeError("%s got multiple values for argument '%s'"
                                % (name, key))
            given[key] = value
    if len(args) > count:
        required = sum(1 for f in all_fields if f.default is MISSING
                       and f.default_factory is MISSING)
        takes = (str(count + 1) if required == count
                 else 'from %d to %d' % (required + 1, count + 1))
        raise TypeError('%s takes %s positional argument%s but %d were '
                        'given' % (name, takes, '' if takes == '1' else 's',
                                   len(args) + 1))
    missing = [f.name for f in all_fields if f.name not in given
               and f.default is MISSING and f.default_factory is MISSING]
    if missing:
        raise TypeError('%s missing %s: %s' % (
            name, _plural(len(missing), 'required positional argument'),
            _names(missing)))
    d = self.__dict__
    for f in all_fields:
        if f.default_factory is not MISSING:
            value = given.get(f.name, MISSING)
            d[f.name] = f.default_factory() if value is MISSING else value
        else:
            d[f.name] = given.get(f.name, f.default)
    if hasattr(cls, '__post_init__'):
        self.__post_init__()


def _init_on_first_use(cls, all_fields):
    """A stand-in ``__init__`` that binds the arguments itself for the
    class's first instantiations, then compiles the real one and puts it
    in its place: a process compiles only the ``__init__`` of the records
    it makes many of (the hook makes few)."""
    made = [0]

    def __init__(self, *args, **kwargs):
        if made[0] < _COMPILE_AFTER:
            made[0] += 1
            return _bind(cls, all_fields, self, args, kwargs)
        init = _make_init(cls, all_fields)
        if cls.__dict__.get('__init__') is __init__:
            cls.__init__ = init
        init(self, *args, **kwargs)
    __init__.__qualname__ = '%s.__init__' % cls.__qualname__
    return __init__


def _key_getter(names):
    """A function of a record giving the tuple of its fields ``names``."""
    if not names:
        return lambda self: ()
    if len(names) == 1:
        get = operator.attrgetter(names[0])
        return lambda self: (get(self),)
    return operator.attrgetter(*names)


def _comparison(op, key):
    def compare(self, other):
        if other.__class__ is self.__class__:
            return op(key(self), key(other))
        return NotImplemented
    compare.__name__ = '__%s__' % op.__name__
    return compare


def _frozen_setattr(self, name, value):
    raise FrozenRecordError('cannot assign to field %r of a frozen %s'
                            % (name, type(self).__name__))


def _frozen_delattr(self, name):
    raise FrozenRecordError('cannot delete field %r of a frozen %s'
                            % (name, type(self).__name__))


def _repr(self):
    return '%s(%s)' % (type(self).__qualname__, ', '.join(
        '%s=%r' % (f.name, getattr(self, f.name))
        for f in self.__record_fields__ if f.repr))


def _build(cls, frozen, order):
    own = cls.__dict__
    all_fields = _collect(cls)
    cls.__record_fields__ = all_fields
    cls.__init__ = _init_on_first_use(cls, all_fields)
    key = _key_getter([f.name for f in all_fields if f.compare])
    if '__repr__' not in own:
        cls.__repr__ = _repr
    if '__eq__' not in own:
        cls.__eq__ = _comparison(operator.eq, key)
    if order:
        for op in (operator.lt, operator.le, operator.gt, operator.ge):
            name = '__%s__' % op.__name__
            if name in own:
                raise TypeError('%s: order=True, but the class defines %s'
                                % (cls.__name__, name))
            setattr(cls, name, _comparison(op, key))
    # As dataclasses: a frozen record is hashable on its compared fields
    # unless the class writes its own __hash__; a mutable one is not.
    if own.get('__hash__') is None:
        if frozen:
            cls.__hash__ = lambda self: hash(key(self))
        else:
            cls.__hash__ = None
    if frozen:
        if '__setattr__' in own or '__delattr__' in own:
            raise TypeError('%s: a frozen record cannot define __setattr__ '
                            'or __delattr__' % cls.__name__)
        cls.__setattr__ = _frozen_setattr
        cls.__delattr__ = _frozen_delattr
    return cls


def record(cls=None, *, frozen=True, order=False):
    """Make ``cls`` a record (see the module docstring); usable bare
    (``@record``) or with options (``@record(order=True)``)."""
    def wrap(c):
        return _build(c, frozen, order)
    return wrap if cls is None else wrap(cls)
