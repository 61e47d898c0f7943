"""Bounds on what is read from outside (domain XML, sysfs, libvirt,
configuration), checked before the work they would cause.

A number, list or range that comes from outside decides how much work
follows: a ``<vcpu cpuset>`` of a few MiB can name billions of CPUs, an
``available_instances`` in the billions would make discovery build
billions of entries.  So:

- CPU and NUMA node lists (``0-15,32-47``, libvirt's ``^n``) are judged by
  their largest member and their length, never expanded: ``CpuList``
  keeps merged ranges, and membership and overlap are answered on them;
- an instance count (``available_instances``, a type's maximum) is at most
  ``MAX_INSTANCES`` and a Placement total at most ``PLACEMENT_MAX`` (the
  32-bit limit of Placement's inventory fields).

docs/admin/configure-types.md ("Bounds") lists them.
"""

from __future__ import annotations

from libvirt_gpu import exception

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable

    _Ranges = list[tuple[int, int]]

# Largest CPU or NUMA node number + 1: a list naming more is not a real
# host's (Linux' NR_CPUS tops out at 8192 today).
MAX_CPU = 1 << 16
# A CPU list is at most this long (characters) and has at most this many
# comma-separated parts: a kernel ``local_cpulist`` is a few ranges, and a
# list of every other CPU of a 4096-CPU host has 2048 parts.
MAX_CPULIST_CHARS = 64 * 1024
MAX_CPULIST_PARTS = 8192
# vGPU instances of one type on one GPU (the largest real count is 64,
# NVIDIA's smallest profiles): ``available_instances`` and maxima above
# are refused as not a real host's.
MAX_INSTANCES = 4096
# Placement stores totals in 32-bit signed integers.
PLACEMENT_MAX = 2 ** 31 - 1


class CpuList(object):
    """A set of CPU (or node) numbers held as sorted, merged, disjoint
    ``(first, last)`` ranges: never expanded."""

    __slots__ = ('ranges',)

    def __init__(self, ranges: Iterable[tuple[int, int]] = ()) -> None:
        self.ranges = tuple(ranges)

    def __bool__(self) -> bool:
        return bool(self.ranges)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, CpuList):
            return self.ranges == other.ranges
        if isinstance(other, (set, frozenset)):
            return len(self) == len(other) and all(n in self for n in other)
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self.ranges)

    def __len__(self) -> int:
        return sum(last - first + 1 for first, last in self.ranges)

    def __contains__(self, number: int) -> bool:
        # binary search over the ranges
        low, high = 0, len(self.ranges)
        while low < high:
            mid = (low + high) // 2
            first, last = self.ranges[mid]
            if number < first:
                high = mid
            elif number > last:
                low = mid + 1
            else:
                return True
        return False

    def intersects(self, other: CpuList | Iterable[int]) -> bool:
        """Whether this list and ``other`` (a CpuList, or any set of
        numbers) share a member."""
        if not isinstance(other, CpuList):
            return any(n in self for n in other)
        mine, theirs = self.ranges, other.ranges
        i = j = 0
        while i < len(mine) and j < len(theirs):
            if mine[i][1] < theirs[j][0]:
                i += 1
            elif theirs[j][1] < mine[i][0]:
                j += 1
            else:
                return True
        return False

    def __repr__(self) -> str:
        return 'CpuList(%r)' % (self.ranges,)


EMPTY = CpuList()


def _merge(ranges: Iterable[tuple[int, int]]) -> _Ranges:
    merged: _Ranges = []
    for first, last in sorted(ranges):
        if merged and first <= merged[-1][1] + 1:
            if last > merged[-1][1]:
                merged[-1] = (merged[-1][0], last)
        else:
            merged.append((first, last))
    return merged


def _subtract(ranges: _Ranges, holes: _Ranges) -> _Ranges:
    """``ranges`` less ``holes`` (both merged and sorted)."""
    result: _Ranges = []
    j = 0
    for first, last in ranges:
        while j < len(holes) and holes[j][1] < first:
            j += 1
        k = j
        while k < len(holes) and holes[k][0] <= last:
            if holes[k][0] > first:
                result.append((first, holes[k][0] - 1))
            first = max(first, holes[k][1] + 1)
            k += 1
        if first <= last:
            result.append((first, last))
    return result


def _plain(digits: str) -> bool:
    return digits.isascii() and digits.isdigit()


def parse_cpulist(text: str | None, what: str = 'cpulist') -> CpuList:
    """The numbers of a kernel or libvirt list (``0-15,32-47``; libvirt's
    ``^n`` excludes n) as a ``CpuList``; InvalidInput naming ``what`` when
    it is not one or passes a bound (the work is linear in the text, which
    is bounded first)."""
    text = text or ''
    if len(text) > MAX_CPULIST_CHARS:
        raise exception.InvalidInput(
            reason='%s is %d characters long, more than the %d allowed'
                   % (what, len(text), MAX_CPULIST_CHARS))
    parts = text.replace(' ', '').split(',')
    if len(parts) > MAX_CPULIST_PARTS:
        raise exception.InvalidInput(
            reason='%s has %d parts, more than the %d allowed'
                   % (what, len(parts), MAX_CPULIST_PARTS))
    chosen: _Ranges = []
    excluded: _Ranges = []
    for part in parts:
        if not part:
            continue
        into = chosen
        if part.startswith('^'):
            into, part = excluded, part[1:]
        first, _, last = part.partition('-')
        if not (_plain(first) and (_plain(last) or not _)) \
                or len(first) > 6 or len(last) > 6:
            low, high = -1, -1
        else:
            low, high = int(first), int(last or first)
        if not 0 <= low <= high < MAX_CPU:
            raise exception.InvalidInput(
                reason='%s %r is not a list of numbers and ranges (0-15,32) '
                       'below %d' % (what, text[:40], MAX_CPU))
        into.append((low, high))
    return CpuList(_subtract(_merge(chosen), _merge(excluded)))


def check_instances(count: int, what: str) -> int:
    """``count`` if it is at most MAX_INSTANCES, else InvalidInput."""
    if count > MAX_INSTANCES:
        raise exception.InvalidInput(
            reason='%s is %d, more than the %d instances of one type a GPU '
                   'can hold' % (what, count, MAX_INSTANCES))
    return count
