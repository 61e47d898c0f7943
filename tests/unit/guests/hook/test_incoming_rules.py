"""What the destination's ``migrate`` hook (guests/hook/incoming.py) does
that the rest of the unit layer left open (docs/dev/mutation.md): NVML
that cannot be set up here (``[gpu]/nvml = simulated`` on a host's own
``/sys``) refuses an incoming migration in one line that names the
setting, reserving nothing -- whether the vGPU would be reserved here or
not (its hostdev left out) -- and is not an internal error of the hook."""

from libvirt_gpu.devices import nvml
from tests.doubles import t4_hook as th
from tests.doubles import h100_migrate as hm
from tests.doubles.h100_migrate import hook_log
from tests.doubles.h100_migrate import incoming
from tests.doubles.h100_migrate import migrate
from tests.doubles.h100_migrate import source_metadata
from tests.doubles.h100_migrate import without_hostdev

h100 = hm.h100


def test_nvml_that_cannot_be_set_up_here_refuses_in_one_line(
        h100, monkeypatch):
    raw = source_metadata(driver_version='550.127.05')
    real = nvml.source

    def on_this_hosts_sys(setting, module=None, sysfs_root=None):
        # the hook's GPUs read from the running kernel's /sys
        return real(setting, module, sysfs_root='/sys')
    monkeypatch.setattr(nvml, 'source', on_this_hosts_sys)
    why = ("Configuration error: [gpu]/nvml = simulated needs a simulated "
           "sysfs root ([DEFAULT]/sysfs_root or --sysfs-root), not this "
           "host's /sys")
    for xml in (incoming(th.new_uuid(), raw),
                without_hostdev(incoming(th.new_uuid(), raw))):
        rc, out, err = migrate(h100, xml)
        assert (rc, out) == (1, b'')
        assert err.startswith("libvirt-gpu: cannot migrate in domain 'vm1'")
        assert err.endswith(': %s\n' % why) and len(err.splitlines()) == 1
        assert 'Traceback' not in hook_log(h100)
    assert h100.leases() == []
