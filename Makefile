# make demo: the main job on a simulated host (no GPU, no libvirtd needed).
# make test: installs everything the suite needs and runs it all.
# Both are idempotent and fast once things are installed.

SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
VPY := $(VENV)/bin/python
APT_PACKAGES := python3-venv python3-dev gcc pkg-config libvirt-dev \
	libvirt-daemon libvirt-daemon-driver-qemu libvirt-clients \
	qemu-system-x86 mdevctl libxml2-utils fuse3 libfuse3-dev util-linux \
	pci.ids kmod e2fsprogs make prometheus zstd xz-utils
STAMP_APT := $(VENV)/.apt-stamp
STAMP_PIP := $(VENV)/.pip-stamp

.PHONY: demo test unit functional kernel-test lint genconfig bench clean deps

include Makefile.placement
include Makefile.cyborg
include Makefile.nova
include Makefile.mutation

deps: $(STAMP_PIP)

# Depends on this Makefile: a package added to APT_PACKAGES is installed
# on machines set up before it was added.
$(STAMP_APT): Makefile
	@missing=$$(for p in $(APT_PACKAGES); do \
	    dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q 'ok installed' || echo $$p; done); \
	if [ -n "$$missing" ]; then \
	    echo "apt: installing $$missing"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing >/dev/null; \
	fi
	@test -x $(VPY) || $(PYTHON) -m venv $(VENV)
	@touch $@

# Our package is installed editable in "compat" mode: the checkout goes on
# sys.path through a plain .pth line.  The default mode installs an import
# finder whose set-up costs every Python start here ~18 ms (a third of a
# hook call's or a CLI call's budget).  setuptools calls compat
# transitional: should it go, drop the option (only start-up time changes).
$(STAMP_PIP): $(STAMP_APT) requirements.txt test-requirements.txt setup.py
	$(VPY) -m pip install -q --disable-pip-version-check --upgrade pip 2> >(grep -v "^WARNING: Location" >&2)
	$(VPY) -m pip install -q --disable-pip-version-check -r requirements.txt -r test-requirements.txt 2> >(grep -v "^WARNING: Location" >&2)
	PYTHONWARNINGS=ignore $(VPY) -m pip install -q --disable-pip-version-check --no-deps -e . --config-settings editable_mode=compat 2> >(grep -v "^WARNING: Location" >&2)
	@touch $@

demo: deps
	$(VPY) -m libvirt_gpu.cmd.demo

# The kernel tests (tests/kernel) start once .venv is ready and run in the
# background beside the rest (tests/phases.sh): their VM leaves a core
# free most of the time.  Their output is printed when they end.
test:
	@bash tests/phases.sh \
	    install '$(MAKE) --no-print-directory deps' \
	    'kernel tests&' '$(VPY) -m pytest -q -p no:cacheprovider --basetemp=.cache/phases/kernel-tmp tests/kernel' \
	    'install services' '$(MAKE) --no-print-directory placement-venv cyborg-venv nova-venv rabbitmq' \
	    lint '$(VPY) -m flake8 libvirt_gpu tests bench hooks/qemu && $(VPY) -m mypy' \
	    'other tests' '$(ON_TMPFS) $(VPY) -m pytest -q tests --ignore=tests/kernel'

# The tests' temporary files on a tmpfs of their own where this user may
# mount one (root): tests/tools/on_tmpfs.py says why.
ON_TMPFS = $(VPY) tests/tools/on_tmpfs.py --

unit: deps
	$(ON_TMPFS) $(VPY) -m pytest -q tests/unit

functional: deps placement-venv cyborg-venv nova-venv rabbitmq
	$(ON_TMPFS) $(VPY) -m pytest -q tests/functional

# Only the tests on a real kernel in a VM (tests/kernel); the kernel, its
# headers and busybox are downloaded once into .cache/ by the tests.
kernel-test: deps
	$(VPY) -m pytest -q tests/kernel

lint: deps
	$(VPY) -m flake8 libvirt_gpu tests bench hooks/qemu
	$(VPY) -m mypy

genconfig: deps
	$(VENV)/bin/oslo-config-generator --config-file etc/libvirt-gpu/libvirt-gpu-config-generator.conf

bench: deps placement-venv
	$(VPY) bench/discovery.py
	$(VPY) bench/list_phases.py
	$(VPY) bench/hook.py
	$(VPY) bench/exporter.py
	$(VPY) bench/pciids.py
	$(VPY) bench/fleet.py --hosts 10,100

clean: placement-clean cyborg-clean nova-clean
	rm -rf $(VENV) build *.egg-info .cache
