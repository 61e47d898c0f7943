"""The tiny guest's domain XML: for the file-backed ``fake_libvirt``, and
(through ``tests/functional/libvirtd.tiny_domain_xml``, which chooses the
domain type for the host) for a real daemon."""

import uuid as uuidlib

QEMU = '/usr/bin/qemu-system-x86_64'


def tiny_domain_xml(name, uuid=None, extra_devices='', metadata='',
                    memory_mib=64, domain_type='kvm', serial_log=None,
                    emulator=QEMU):
    """XML of a tiny guest that starts in well under a second.

    64 MiB, one vCPU, no disk, no network, no graphics, no video, no
    balloon. ``extra_devices`` goes inside ``<devices>``; ``metadata`` inside
    ``<metadata>``. ``serial_log``: a file path for a serial port (none by
    default).
    """
    if uuid is None:
        uuid = str(uuidlib.uuid4())
    serial = ''
    if serial_log:
        serial = ("<serial type='file'><source path='%s'/>"
                  "<target port='0'/></serial>" % serial_log)
    meta = '<metadata>%s</metadata>' % metadata if metadata else ''
    return f'''<domain type='{domain_type}'>
  <name>{name}</name>
  <uuid>{uuid}</uuid>
  {meta}
  <memory unit='MiB'>{memory_mib}</memory>
  <vcpu>1</vcpu>
  <os><type arch='x86_64' machine='pc'>hvm</type></os>
  <on_poweroff>destroy</on_poweroff>
  <on_reboot>restart</on_reboot>
  <on_crash>destroy</on_crash>
  <devices>
    <emulator>{emulator}</emulator>
    <controller type='usb' model='none'/>
    <video><model type='none'/></video>
    <memballoon model='none'/>
    {serial}
    {extra_devices}
  </devices>
</domain>
'''
