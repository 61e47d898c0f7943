"""What a domain asks of us, kept in its ``<metadata>``.

The format (namespace ``urn:libvirt-gpu:1``; the prefix is free)::

    <metadata>
      <gpu:gpus xmlns:gpu="urn:libvirt-gpu:1">
        <gpu:vgpu uuid="4b20d080-1b54-4048-85b3-a6a62d165c01"
                  type="nvidia-223" parent="0000:af:00.0"/>
        <gpu:pgpu address="0000:3b:00.0"/>
      </gpu:gpus>
    </metadata>

with, for each entry, the matching ``<hostdev>`` in ``<devices>``.  A
``vgpu`` may carry ``nvidia-metadata=``: NVIDIA's metadata of that vGPU
(``nvmlVgpuInstanceGetMetadata``'s structure, opaque, base64, at most
``MAX_NVIDIA_METADATA`` bytes), written on the source host before a live
migration so that the destination's hook can ask NVIDIA's driver there
whether the vGPU may come (docs/admin/migration.md).  A
``vgpu`` without ``parent`` means "any GPU of this host that offers this
enabled type": the GPU is chosen when the vGPU is created.  Parsing is
strict: an unknown element or attribute in our namespace, a duplicate, or a
value that is not a UUID / type id / PCI address is refused with the reason,
because the hook acts on this and must never act on a guess.
"""


from __future__ import annotations

from libvirt_gpu.virt import config_xml
from libvirt_gpu import exception
from libvirt_gpu import objects
from libvirt_gpu.util import records

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Hashable
    from typing import TypeVar

    from libvirt_gpu.util.xmlutil import Element

    _Built = TypeVar('_Built')

NAMESPACE = 'urn:libvirt-gpu:1'
# The prefix libvirt writes when we call setMetadata(key=PREFIX).
PREFIX = 'gpu'
ROOT = 'gpus'
_NS = '{%s}' % NAMESPACE
NVIDIA_ATTR = 'nvidia-metadata'
_VGPU_ATTRS = {'uuid', 'type', 'parent', NVIDIA_ATTR}
# Most bytes of NVIDIA's metadata of one vGPU (nvidia-ml-py's
# nvmlVgpuMetadata_t is 468 bytes).
MAX_NVIDIA_METADATA = 4096
_PGPU_ATTRS = {'address', 'companions'}


@records.record
class VgpuEntry:
    """``<gpu:vgpu uuid=... type=... [parent=...]/>``"""

    uuid: objects.Uuid
    type_id: objects.TypeId
    parent: objects.PciAddress | None = None
    # NVIDIA's metadata of the vGPU on the host it comes from (bytes)
    driver_metadata: bytes | None = None


@records.record
class PgpuEntry:
    """``<gpu:pgpu address=... companions=.../>``: a whole GPU and the
    functions of its IOMMU group handed over with it (its HDMI audio),
    comma-separated, so that a detach takes them all back."""

    address: objects.PciAddress
    companions: tuple[objects.PciAddress, ...] = ()


@records.record
class GpuMetadata:
    """Everything in one domain's ``<gpu:gpus>`` element."""

    vgpus: tuple[VgpuEntry, ...] = ()
    pgpus: tuple[PgpuEntry, ...] = ()

    @property
    def empty(self) -> bool:
        return not self.vgpus and not self.pgpus

    def vgpu(self, uuid: objects.Uuid) -> VgpuEntry | None:
        objects.typed(uuid, objects.Uuid, 'uuid')
        for entry in self.vgpus:
            if entry.uuid == uuid:
                return entry
        return None

    def pgpu(self, address: objects.PciAddress) -> PgpuEntry | None:
        objects.typed(address, objects.PciAddress, 'address')
        for entry in self.pgpus:
            if entry.address == address:
                return entry
        return None

    def with_vgpu(self, entry: VgpuEntry) -> GpuMetadata:
        if self.vgpu(entry.uuid) is not None:
            raise exception.MetadataError(
                reason='vGPU %s is listed already' % entry.uuid)
        return records.replace(self, vgpus=self.vgpus + (entry,))

    def without_vgpu(self, uuid: objects.Uuid) -> GpuMetadata:
        objects.typed(uuid, objects.Uuid, 'uuid')
        return records.replace(
            self, vgpus=tuple(e for e in self.vgpus if e.uuid != uuid))

    def with_pgpu(self, entry: PgpuEntry) -> GpuMetadata:
        if self.pgpu(entry.address) is not None:
            raise exception.MetadataError(
                reason='GPU %s is listed already' % entry.address)
        return records.replace(self, pgpus=self.pgpus + (entry,))

    def without_pgpu(self, address: objects.PciAddress) -> GpuMetadata:
        objects.typed(address, objects.PciAddress, 'address')
        return records.replace(
            self, pgpus=tuple(e for e in self.pgpus if e.address != address))


def _check_attrs(elem: Element, allowed: set[str], what: str) -> None:
    unknown = sorted(set(elem.attrib) - allowed)
    if unknown:
        raise exception.MetadataError(
            reason='<%s> has unknown attribute(s) %s; allowed: %s'
            % (what, ', '.join(repr(a)[:60] for a in unknown),
               ', '.join(sorted(allowed))))


def _required(elem: Element, name: str, what: str) -> str:
    value = elem.get(name)
    if value is None:
        raise exception.MetadataError(reason='<%s> lacks %s=' % (what, name))
    return value


def _entry(what: str, build: Callable[[], _Built]) -> _Built:
    """``build()``, its invalid values reported as ``<what>: ...``."""
    try:
        return build()
    except exception.MetadataError:
        raise
    except exception.InvalidInput as e:
        raise exception.MetadataError(reason='<%s>: %s' % (what, e))


def _nvidia(text: str | None) -> bytes | None:
    """The bytes of ``nvidia-metadata=`` (strict base64, bounded)."""
    if text is None:
        return None
    # imported here: base64 loads re, which a guest start never pays for
    import base64
    import binascii
    if len(text) > 4 * ((MAX_NVIDIA_METADATA + 2) // 3):
        raise exception.MetadataError(
            reason='<vgpu> %s= is longer than NVIDIA\'s metadata of a vGPU '
                   'can be (%d bytes at most)'
                   % (NVIDIA_ATTR, MAX_NVIDIA_METADATA))
    try:
        found = base64.b64decode(text.encode('ascii'), validate=True)
    except (UnicodeEncodeError, binascii.Error):
        found = b''
    if not found:
        raise exception.MetadataError(
            reason='<vgpu> %s= is not base64 of NVIDIA\'s metadata; drop '
                   'it (libvirt-gpu migrate writes it again)' % NVIDIA_ATTR)
    return found


def _once(seen: set[Hashable], key: Hashable, what: str) -> None:
    """Refuse a second entry for the same vGPU UUID or GPU address."""
    if key in seen:
        raise exception.MetadataError(
            reason='%s %s is listed twice' % (what, key))
    seen.add(key)


def parse_element(gpus: Element) -> GpuMetadata:
    """``GpuMetadata`` of one ``<gpu:gpus>`` element (ElementTree,
    ``xmlutil.parse``)."""
    vgpus: list[VgpuEntry] = []
    pgpus: list[PgpuEntry] = []
    seen_uuids: set[Hashable] = set()
    seen_addresses: set[Hashable] = set()
    if len(gpus.attrib):
        _check_attrs(gpus, set(), 'gpus')
    for child in gpus:
        if not isinstance(child.tag, str):
            continue   # comments and processing instructions
        if child.tag == _NS + 'vgpu':
            _check_attrs(child, _VGPU_ATTRS, 'vgpu')
            entry = _entry('vgpu', lambda: VgpuEntry(
                uuid=objects.Uuid.parse(_required(child, 'uuid', 'vgpu')),
                type_id=objects.TypeId.parse(
                    _required(child, 'type', 'vgpu')),
                parent=(objects.PciAddress.parse(child.get('parent'))
                        if child.get('parent') is not None else None),
                driver_metadata=_nvidia(child.get(NVIDIA_ATTR))))
            _once(seen_uuids, entry.uuid, 'vGPU')
            vgpus.append(entry)
        elif child.tag == _NS + 'pgpu':
            _check_attrs(child, _PGPU_ATTRS, 'pgpu')
            pgpu = _entry('pgpu', lambda: PgpuEntry(
                address=objects.PciAddress.parse(
                    _required(child, 'address', 'pgpu')),
                companions=tuple(
                    objects.PciAddress.parse(a) for a in
                    (child.get('companions') or '').split(',') if a)))
            _once(seen_addresses, pgpu.address, 'GPU')
            pgpus.append(pgpu)
        else:
            raise exception.MetadataError(
                reason='unknown element %s; expected <vgpu> or <pgpu> in '
                       'namespace %s' % (str(child.tag)[:80], NAMESPACE))
    return GpuMetadata(vgpus=tuple(vgpus), pgpus=tuple(pgpus))


def parse(domain: Element) -> GpuMetadata:
    """``GpuMetadata`` of a parsed ``<domain>`` (empty when it has none)."""
    found = domain.findall('metadata/%s%s' % (_NS, ROOT))
    if not found:
        return GpuMetadata()
    holders = domain.findall('metadata')
    if len(holders) > 1:
        # libvirt reads the first <metadata> only: acting on ours in
        # another would act on what libvirt does not keep
        raise exception.MetadataError(
            reason='the domain has %d <metadata> elements and libvirt reads '
                   'only the first; put every application\'s metadata in '
                   'one <metadata>' % len(holders))
    if len(found) > 1:
        raise exception.MetadataError(
            reason='the domain has %d <gpus> elements; libvirt keeps one '
                   'per namespace' % len(found))
    return parse_element(found[0])


def _attr(value: object) -> str:
    return '"%s"' % config_xml.escape(value)


def _base64(raw: bytes) -> str:
    import base64
    return base64.b64encode(raw).decode('ascii')


def render(meta: GpuMetadata) -> str:
    """The element to hand to ``virDomainSetMetadata(key='gpu',
    uri=NAMESPACE)``, unprefixed (libvirt puts every element of it into our
    namespace)::

        <gpus><vgpu uuid="..." type="nvidia-223"/><pgpu address="..."/></gpus>
    """
    parts = ['<%s>' % ROOT]
    for entry in meta.vgpus:
        parent = (' parent=%s' % _attr(entry.parent)
                  if entry.parent is not None else '')
        nvidia = (' %s=%s' % (NVIDIA_ATTR, _attr(_base64(
            entry.driver_metadata))) if entry.driver_metadata else '')
        parts.append('<vgpu uuid=%s type=%s%s%s/>' % (
            _attr(objects.typed(entry.uuid, objects.Uuid, 'uuid')),
            _attr(objects.typed(entry.type_id, objects.TypeId, 'type_id')),
            parent, nvidia))
    for pgpu in meta.pgpus:
        companions = (' companions=%s' % _attr(','.join(
            str(objects.typed(a, objects.PciAddress, 'companion'))
            for a in pgpu.companions))
            if pgpu.companions else '')
        parts.append('<pgpu address=%s%s/>' % (_attr(pgpu.address),
                                               companions))
    parts.append('</%s>' % ROOT)
    return ''.join(parts)


def render_document(meta: GpuMetadata, prefix: str = PREFIX) -> str:
    """The same element as it appears inside a domain's ``<metadata>``,
    namespaced (for hand-written XML and tests)::

        <gpu:gpus xmlns:gpu="urn:libvirt-gpu:1">
          <gpu:vgpu uuid="..." type="nvidia-223"/>
        </gpu:gpus>
    """
    body = render(meta)
    body = body.replace('<gpus>', '<%s:gpus xmlns:%s="%s">'
                        % (prefix, prefix, NAMESPACE), 1)
    body = body.replace('</gpus>', '</%s:gpus>' % prefix)
    body = body.replace('<vgpu ', '<%s:vgpu ' % prefix)
    return body.replace('<pgpu ', '<%s:pgpu ' % prefix)
