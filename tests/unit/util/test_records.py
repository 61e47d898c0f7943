"""records.record: the value classes every layer passes around.

Each property the code relies on (it relied on frozen dataclasses before)
is pinned here: construction and defaults, equality and hashing on the
compared fields only, order, immutability, ``__post_init__``, ``replace``,
``asdict``, inheritance, copying and pickling.
"""

from __future__ import annotations

import copy
import pickle

import pytest

from libvirt_gpu.util import records


@records.record(order=True)
class Point:
    x: int
    y: int = 0
    label: str | None = records.field(default=None, compare=False)
    secret: str = records.field(default='s', repr=False)


@records.record
class Bag:
    items: list = records.field(default_factory=list)


@records.record
class Checked:
    value: int

    def __post_init__(self):
        if self.value < 0:
            raise ValueError('negative')
        object.__setattr__(self, 'value', int(self.value))


@records.record
class Point3(Point):
    z: int = 0


@records.record(frozen=False)
class Counter:
    count: int = 0


def test_fields_defaults_and_keywords():
    p = Point(1)
    assert (p.x, p.y, p.label, p.secret) == (1, 0, None, 's')
    assert Point(x=1, y=2) == Point(1, 2)
    assert [f.name for f in records.fields(Point)] == [
        'x', 'y', 'label', 'secret']
    with pytest.raises(TypeError):
        Point()
    with pytest.raises(TypeError):
        Point(1, nope=3)


def test_equality_and_hash_ignore_uncompared_fields():
    assert Point(1, 2, label='a') == Point(1, 2, label='b')
    assert hash(Point(1, 2, label='a')) == hash(Point(1, 2, label='b'))
    assert Point(1, 2) != Point(1, 3)
    assert len({Point(1, 2), Point(1, 2, 'x'), Point(2, 2)}) == 2
    # another class with the same values is not equal
    assert Point3(1, 2) != Point(1, 2)
    assert (Point(1, 2) == (1, 2)) is False


def test_order_compares_field_tuples():
    assert sorted([Point(2, 0), Point(1, 5), Point(1, 1)]) == [
        Point(1, 1), Point(1, 5), Point(2, 0)]
    assert Point(1, 1) < Point(1, 2) <= Point(1, 2)
    with pytest.raises(TypeError):
        Checked(1) < Checked(2)     # no order unless asked


def test_frozen():
    p = Point(1)
    with pytest.raises(records.FrozenRecordError):
        p.x = 2
    with pytest.raises(AttributeError):
        del p.y
    assert p.x == 1


def test_mutable_record_is_not_hashable():
    c = Counter()
    c.count += 1
    assert c == Counter(1)
    with pytest.raises(TypeError):
        hash(c)


def test_default_factory_gives_each_instance_its_own():
    a, b = Bag(), Bag()
    a.items.append(1)
    assert b.items == [] and a.items == [1]


def test_post_init_runs_on_construction_and_replace():
    assert Checked(3).value == 3
    with pytest.raises(ValueError):
        Checked(-1)
    with pytest.raises(ValueError):
        records.replace(Checked(1), value=-5)


def test_replace_and_asdict():
    p = Point(1, 2, label='a')
    q = records.replace(p, y=5)
    assert (q.x, q.y, q.label) == (1, 5, 'a') and p.y == 2
    nested = Bag(items=[Point(1), (Point(2),)])
    assert records.asdict(nested) == {'items': [
        {'x': 1, 'y': 0, 'label': None, 'secret': 's'},
        ({'x': 2, 'y': 0, 'label': None, 'secret': 's'},)]}
    with pytest.raises(TypeError):
        records.fields(object())


def test_repr_leaves_out_repr_false_fields():
    assert repr(Point(1, 2)) == 'Point(x=1, y=2, label=None)'


def test_inheritance_appends_fields():
    p = Point3(1, 2, None, 's', 3)
    assert [f.name for f in records.fields(p)] == [
        'x', 'y', 'label', 'secret', 'z']
    assert p.z == 3 and records.is_record(p) and not records.is_record(1)


def test_non_default_after_default_is_refused():
    with pytest.raises(TypeError, match='without a default'):
        @records.record
        class Bad:
            a: int = 1
            b: int


def test_copy_and_pickle_round_trip():
    p = Point(1, 2, label='a')
    for other in (copy.copy(p), copy.deepcopy(p),
                  pickle.loads(pickle.dumps(p))):
        assert other == p and other.label == 'a'
        with pytest.raises(records.FrozenRecordError):
            other.x = 9


def test_init_compiled_after_a_few_instances():
    @records.record
    class Late:
        a: int
        b: int = 2
    stand_in = Late.__dict__['__init__']
    for _ in range(records._COMPILE_AFTER):
        assert Late(1).b == 2
        assert Late.__dict__['__init__'] is stand_in    # bound by _bind
    assert Late(1).b == 2
    compiled = Late.__dict__['__init__']
    assert compiled is not stand_in
    assert compiled.__code__.co_varnames[:3] == ('self', 'a', 'b')
    assert Late(a=3, b=4) == Late(3, 4)

    class Plain(Late):          # not a record: inherits the same __init__
        pass
    assert Plain(5).a == 5


def _classes():
    """Records of every shape, each made afresh (its stand-in unused)."""
    def post_init(self):
        self.__dict__['seen'] = (self.a, len(self.items))

    shapes = []
    for post in (False, True):
        namespace = {'__annotations__': {'a': 'int', 'b': 'int',
                                         'items': 'list', 'c': 'str'},
                     'b': 2, 'items': records.field(default_factory=list),
                     'c': records.field(default='x', compare=False)}
        if post:
            namespace['__post_init__'] = post_init
        shapes.append(namespace)
    shapes.append({'__annotations__': {}})
    shapes.append({'__annotations__': {'a': 'int', 'b': 'int', 'c': 'int'}})
    shapes.append({'__annotations__': {'a': 'int'}, 'a': 5})
    return [lambda ns=ns: records.record(type('R', (), dict(ns)))
            for ns in shapes]


CALLS = [((), {}), ((1,), {}), ((1, 2), {}), ((1, 2, [3]), {}),
         ((1, 2, [3], 'y'), {}), ((1, 2, [3], 'y', 5), {}),
         ((1, 2, 3, 4, 5, 6), {}), ((), {'a': 1}), ((), {'b': 1}),
         ((1,), {'a': 1}), ((1,), {'c': 'z', 'b': 0}), ((), {'zz': 1}),
         ((1,), {'zz': 1, 'a': 2}), ((1, 2, 3, 4, 5), {'zz': 1}),
         ((), {'c': 1, 'b': 2}), ((1,), {'items': records.MISSING}),
         ((), {'a': 1, 'b': 2, 'c': 3}), ((1, 2), {'a': 3, 'b': 4})]


def _outcome(make, args, kwargs):
    try:
        obj = make(*args, **kwargs)
    except TypeError as e:
        return ('raised', str(e))
    return ('made', sorted(obj.__dict__.items(), key=str))


def test_binding_before_compiling_is_the_compiled_init():
    # the first instances bind their arguments in _bind; they must come
    # out as the compiled __init__ makes them, errors and messages too
    for new_class in _classes():
        for args, kwargs in CALLS:
            fresh = new_class()
            compiled = new_class()
            compiled.__init__ = records._make_init(
                compiled, compiled.__record_fields__)
            assert (_outcome(fresh, args, dict(kwargs))
                    == _outcome(compiled, args, dict(kwargs))), (
                        fresh.__record_fields__, args, kwargs)
            assert fresh.__dict__['__init__'] is not compiled.__init__
