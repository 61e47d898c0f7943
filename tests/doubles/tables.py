"""Read back the CLI's text tables (``cmd.output.table``) by column: a cell
may hold spaces (a product name), so splitting a row on blanks would not
do.  The rule line under the header gives each column's span."""

import re


def rows(out):
    """``[{header: cell}]`` of the first table in ``out``."""
    lines = out.splitlines()
    for i, line in enumerate(lines[1:], start=1):
        if line and set(line) <= {'-', ' '} and '-' in line:
            spans = [m.span() for m in re.finditer(r'-+', line)]
            header = lines[i - 1]
            break
    else:
        raise AssertionError('no table in %r' % out)
    # A column runs to the start of the next; the last to the line's end.
    bounds = [(s, spans[k + 1][0] if k + 1 < len(spans) else None)
              for k, (s, _e) in enumerate(spans)]
    names = [header[s:e].strip() for s, e in bounds]
    found = []
    for line in lines[i + 1:]:
        if not line.startswith(tuple('0123456789abcdef')):
            break
        cells = zip(names, bounds)
        found.append({n: line[s:e].strip() for n, (s, e) in cells})
    return found


def row(out, first):
    """The row whose first cell is ``first``."""
    for entry in rows(out):
        if next(iter(entry.values())) == first:
            return entry
    raise AssertionError('no row %s in %r' % (first, out))
