"""The four layouts the live layout tests apply (one per simulated GPU
that has layouts) and the config file that names each: shared by
test_layouts_live and test_layouts_placement."""

import collections


Case = collections.namedtuple('Case', [
    'profile', 'gpu', 'layout', 'type_id', 'capacity', 'per_gi', 'other'])
"""``layout``: the lines of ``[layout_e2e]``; ``type_id``: the layout's
first type (the one the allocator and the hook use); ``capacity``: how
many of it the simulated driver creates on the GPU at this layout;
``per_gi``: how many share one GPU instance (None: a mixed-size GPU,
whose vGPUs sit at placements); ``other``: another layout for the GPU
(refused while it holds vGPUs)."""

CASES = [
    # 3g.20gb at placement 0 (slices 0-3), the 1g.5gb at 4, 5 and 6; the
    # A100-1-5C lives in a 1g.5gb GI, one per GI
    Case('a100-40gb', '0000:41:00.0',
         ('mode = mig', 'gpu_instances = 3g.20gb:1, 1g.5gb:3',
          'vgpu_types = nvidia-474, nvidia-476'),
         'nvidia-474', 3, 1, 'gpu_instances = 3g.20gb:1, 1g.5gb:2'),
    # three 2g.20gb (slices 0-1, 2-3, 4-5) and a 1g.10gb (6): an
    # H100-2-20C in each 2g.20gb GI
    Case('h100-80gb', '0000:4e:00.0',
         ('mode = mig', 'gpu_instances = 2g.20gb:3, 1g.10gb:1',
          'vgpu_types = nvidia-1311, nvidia-1308'),
         'nvidia-1311', 3, 1, 'gpu_instances = 2g.20gb:2, 1g.10gb:1'),
    # the empty L40S in mixed sizes: three L40S-12Q (placement size 8, at
    # 0, 8, 16, 24) next to one L40S-1B, which may sit in any of the four
    # 12Q placements: the counts that always fit together
    Case('l40s', '0000:bd:00.0',
         ('mode = mixed-size', 'vgpu_types = nvidia-1153:3, nvidia-1145:1',
          'scheduler = equal-share', 'time_slice_ms = 4'),
         'nvidia-1153', 3, None, 'time_slice_ms = 8'),
    # two DC-1-12Q share each 1g.24gb+gfx GI in time
    Case('rtx-pro-6000', '0000:ca:00.0',
         ('mode = mig-time-sliced',
          'gpu_instances = 2g.48gb+gfx:1, 1g.24gb+gfx:2',
          'vgpu_types = nvidia-1511, nvidia-1513',
          'scheduler = equal-share', 'time_slice_ms = 2'),
         'nvidia-1511', 4, 2,
         'gpu_instances = 2g.48gb+gfx:1, 1g.24gb+gfx:1'),
]


def config_text(live_root, state_dir, case, other=False):
    lines = list(case.layout)
    if other:
        key = case.other.split(' = ')[0]
        lines = [ln for ln in lines if not ln.startswith(key + ' ')]
        lines.append(case.other)
    return ('[DEFAULT]\nsysfs_root = %s\nstate_dir = %s\n'
            '[gpu]\nnvml = simulated\nlayouts = e2e\n'
            '[layout_e2e]\ngpus = %s\n%s\n'
            % (live_root, state_dir, case.gpu, '\n'.join(lines)))
