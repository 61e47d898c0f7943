"""A small client of the OpenStack Placement API (over keystoneauth1).

Only what the sync needs: providers, inventories, traits, allocations.
Every call returns records (``records.record``) or raises a narrow error below.

Microversion: the first request asks ``GET /`` for the server's range and
then every request carries ``OpenStack-API-Version: placement <v>`` with
``v = min(MAX_VERSION, server max)``; a server below ``MIN_VERSION`` is
refused with :class:`PlacementVersionTooOld`.

Generation-aware writes (inventories, traits) that Placement refuses with
``409 placement.concurrent_update`` re-read the provider's generation and
retry, a bounded number of times with jittered exponential backoff; a
``placement.inventory.inuse`` refusal is final.

Error bodies look like (microversion >= 1.23)::

    {"errors": [{"status": 409, "code": "placement.concurrent_update",
                 "title": "Conflict", "detail": "..."}]}
"""

from __future__ import annotations

import collections
import json
import re
import typing
import urllib.parse

from keystoneauth1 import adapter as ks_adapter
from keystoneauth1 import exceptions as ks_exc
from keystoneauth1 import loading as ks_loading
from keystoneauth1 import session as ks_session
from keystoneauth1 import token_endpoint
import tenacity

from libvirt_gpu.conf import placement as placement_conf
from libvirt_gpu import exception
from libvirt_gpu import objects
from libvirt_gpu.openstack.placement import tree
from libvirt_gpu.util import logs
from libvirt_gpu.util import records

LOG = logs.getLogger(__name__)

# 1.26: an inventory may have reserved == total (how we keep a provider
# whose GPU vanished while guests still hold allocations on it). 1.14 (in
# tree, parents), 1.20 (POST returns the provider) and 1.23 (error codes)
# come before it.
MIN_VERSION = (1, 26)
# 1.37 lets PUT /resource_providers/{uuid} change a parent (before, only
# set one where there was none); 1.39 is the newest microversion we know.
MAX_VERSION = (1, 39)

STANDARD_TRAIT_RE = re.compile(r'[A-Z][A-Z0-9_]{0,254}')

CODE_CONCURRENT_UPDATE = 'placement.concurrent_update'
CODE_INVENTORY_INUSE = 'placement.inventory.inuse'
CODE_DUPLICATE_NAME = 'placement.duplicate_name'
CODE_PROVIDER_INUSE = 'placement.resource_provider.inuse'
CODE_CANNOT_DELETE_PARENT = 'placement.resource_provider.cannot_delete_parent'


# --------------------------------------------------------------------------
# Errors

class PlacementError(exception.LibvirtGpuError):
    msg_fmt = ("Placement refused %(method)s %(url)s (HTTP %(status)s "
               "%(code)s): %(detail)s")


class PlacementUnavailable(PlacementError):
    msg_fmt = ("Cannot reach Placement at %(endpoint)s: %(reason)s. Is the "
               "service up? Check [placement] endpoint_override / "
               "valid_interfaces / region_name, or the --url given")


class PlacementServerError(PlacementUnavailable):
    msg_fmt = ("Placement at %(endpoint)s failed: %(reason)s. This is on "
               "Placement's side (see its log); the next sync will try "
               "again")


class PlacementAuthError(PlacementError):
    msg_fmt = ("Placement at %(endpoint)s refused our credentials "
               "(%(reason)s). Check the [placement] auth options (auth_type, "
               "auth_url, username, password, project_name, ...); for a "
               "noauth2 Placement leave auth_type unset")


class PlacementConfigError(PlacementError):
    msg_fmt = ("Placement is not configured: %(reason)s")


class ComputeNodeMissing(PlacementError):
    msg_fmt = ("No provider named %(host)s in Placement yet, and this host "
               "has GPUs carved for Nova ([nova]/carved): the provider of "
               "that name is Nova's compute node, which nova-compute "
               "creates. Start nova-compute (or wait for its first report), "
               "then sync again; libvirt-gpu nests its GPU providers under "
               "it and never creates it")


class PlacementVersionTooOld(PlacementError):
    msg_fmt = ("Placement at %(endpoint)s supports microversions up to "
               "%(server)s; libvirt-gpu needs %(needed)s or later (OpenStack "
               "Stein or newer). Upgrade Placement")


class GenerationConflict(PlacementError):
    msg_fmt = ("Provider %(uuid)s kept changing while we wrote its "
               "%(what)s (%(attempts)d attempts, each refused with "
               "placement.concurrent_update): another writer is busy with "
               "it. The next sync will try again")


class InventoryInUse(PlacementError):
    msg_fmt = ("Cannot change the inventory of provider %(uuid)s: "
               "%(detail)s. Guests hold allocations against the capacity "
               "being removed; stop or migrate them, or enable the previous "
               "vGPU type again")


class ProviderConflict(PlacementError):
    msg_fmt = ("Cannot create provider %(name)s (%(uuid)s): %(detail)s. "
               "Another service owns a provider of that name (Nova's own "
               "vGPU support names its providers the same way: disable "
               "[devices]/enabled_mdev_types in nova.conf on this host, or "
               "delete the stale provider with `openstack resource provider "
               "delete`)")


class ProviderInUse(PlacementError):
    msg_fmt = ("Provider %(uuid)s cannot be deleted: %(detail)s")


class ProviderNotFound(PlacementError):
    msg_fmt = "No resource provider %(uuid)s in Placement"


class TraitNotFound(PlacementError):
    msg_fmt = ("Placement does not know trait(s) in %(traits)s: "
               "%(detail)s. Standard traits come from os-traits; upgrade "
               "Placement, or turn off the traits it lacks")


class InvalidTrait(PlacementError):
    msg_fmt = ("%(trait)r is not a trait name (custom traits match "
               "CUSTOM_[A-Z0-9_]+, at most 255 characters)")


# --------------------------------------------------------------------------
# Records

@records.record
class Provider:
    """One entry of ``GET /resource_providers``."""

    uuid: str
    name: str
    generation: int
    parent_provider_uuid: str | None
    root_provider_uuid: str

    @classmethod
    def from_api(cls, body):
        return cls(uuid=body['uuid'], name=body['name'],
                   generation=body['generation'],
                   parent_provider_uuid=body.get('parent_provider_uuid'),
                   root_provider_uuid=body.get('root_provider_uuid',
                                               body['uuid']))


@records.record
class ProviderInventories:
    generation: int
    inventories: tuple[tree.Inventory, ...]

    def to_api(self):
        return {inv.resource_class: inv.to_api() for inv in self.inventories}


@records.record
class ProviderTraits:
    generation: int
    traits: frozenset[str]


@records.record
class ConsumerAllocation:
    consumer_uuid: str
    resources: tuple[tuple[str, int], ...]   # (class, amount)


@records.record
class ProviderAllocations:
    generation: int
    consumers: tuple[ConsumerAllocation, ...]

    @property
    def in_use(self):
        return bool(self.consumers)


@records.record
class PlannedRequest:
    """One request as it goes on the wire (body is the JSON payload)."""

    method: str
    url: str
    body: object | None = None

    def __str__(self):
        if self.body is None:
            return '%s %s' % (self.method, self.url)
        return '%s %s %s' % (self.method, self.url,
                             json.dumps(self.body, sort_keys=True))


@records.record(frozen=False)
class RequestStats:
    """Requests sent, by HTTP method (failed ones included)."""

    by_method: typing.Counter = records.field(
        default_factory=collections.Counter)

    @property
    def total(self):
        return sum(self.by_method.values())

    @property
    def reads(self):
        return self.by_method['GET']

    @property
    def writes(self):
        return self.total - self.reads

    def copy(self):
        return RequestStats(collections.Counter(self.by_method))

    def __sub__(self, other):
        diff = collections.Counter(self.by_method)
        diff.subtract(other.by_method)
        return RequestStats(+diff)


def _inventory_from_api(resource_class, body):
    return tree.Inventory(resource_class=resource_class,
                          total=body['total'],
                          reserved=body.get('reserved', 0),
                          min_unit=body.get('min_unit', 1),
                          max_unit=body.get('max_unit'),
                          step_size=body.get('step_size', 1),
                          allocation_ratio=body.get('allocation_ratio', 1.0))


def _format_version(version):
    return '%d.%d' % version


def _parse_version(text):
    major, minor = text.split('.')
    return int(major), int(minor)


def validate_trait(name):
    if not isinstance(name, str) or len(name) > 255 or (
            STANDARD_TRAIT_RE.fullmatch(name) is None):
        raise InvalidTrait(trait=name)
    return name


# --------------------------------------------------------------------------
# Client

def _is_concurrent_update(exc):
    return (isinstance(exc, PlacementError)
            and exc.kwargs.get('code') == CODE_CONCURRENT_UPDATE)


class PlacementClient:
    """Placement over a keystoneauth1 Adapter.

    ``before_request`` (a callable taking a :class:`PlannedRequest`), when
    set, is called just before each request is sent: tests use it to slip a
    concurrent write in between our read and our write.
    """

    def __init__(self, adapter, *, conflict_retries=4, retry_wait=0.05,
                 retry_wait_max=1.0):
        self._adapter = adapter
        self.conflict_retries = conflict_retries
        self.retry_wait = retry_wait
        self.retry_wait_max = retry_wait_max
        self.stats = RequestStats()
        self.before_request = None
        self._version = None
        self._known_traits = set()

    # -- construction ----------------------------------------------------

    @classmethod
    def from_url(cls, url, token='admin', **kwargs):
        """A client for a Placement with ``auth_strategy = noauth2``.

        Every request carries ``X-Auth-Token: <token>``.
        """
        sess = ks_session.Session(auth=token_endpoint.Token(url, token))
        adapter = ks_adapter.Adapter(sess, service_type='placement',
                                     endpoint_override=url)
        return cls(adapter, **kwargs)

    @classmethod
    def from_conf(cls, conf, url=None, **kwargs):
        """A client from the [placement] options (see conf/placement.py).

        With ``auth_type`` set, keystoneauth loads the session, the auth
        plugin and the adapter from [placement] (``url``, when given,
        overrides the endpoint). Without it, ``url`` or ``endpoint_override``
        must name a noauth2 Placement.
        """
        placement_conf.register_auth_opts(conf)
        group = conf.placement
        kwargs.setdefault('conflict_retries', group.conflict_retries)
        if group.auth_type:
            auth = ks_loading.load_auth_from_conf_options(conf, 'placement')
            sess = ks_loading.load_session_from_conf_options(
                conf, 'placement', auth=auth)
            adapter = ks_loading.load_adapter_from_conf_options(
                conf, 'placement', session=sess, auth=auth,
                endpoint_override=url or group.endpoint_override)
            return cls(adapter, **kwargs)
        url = url or group.endpoint_override
        if not url:
            raise PlacementConfigError(
                reason='set the [placement] auth options (auth_type = '
                       'password, auth_url, username, ...) to use the '
                       'service catalog, or pass --url / set [placement] '
                       'endpoint_override for a noauth2 Placement')
        return cls.from_url(url, token=group.noauth_token, **kwargs)

    # -- plumbing ----------------------------------------------------------

    @property
    def endpoint(self):
        override = self._adapter.endpoint_override
        if override:
            return override
        try:
            return self._adapter.get_endpoint() or '<placement>'
        except ks_exc.ClientException:
            return '<placement from the service catalog>'

    @property
    def microversion(self):
        """The negotiated microversion, e.g. ``(1, 39)``."""
        if self._version is None:
            self._negotiate()
        return self._version

    def _negotiate(self):
        # GET / (no microversion) ->
        # {"versions": [{"id": "v1.0", "min_version": "1.0",
        #                "max_version": "1.39", "status": "CURRENT"}]}
        body = self._send('GET', '/', versioned=False)
        try:
            versions = body['versions']
            server = max(_parse_version(v['max_version']) for v in versions)
        except (KeyError, TypeError, ValueError) as exc:
            raise PlacementError(
                method='GET', url='/', status=200, code='-',
                detail='not a Placement version document (%s)' % exc)
        if server < MIN_VERSION:
            raise PlacementVersionTooOld(endpoint=self.endpoint,
                                         server=_format_version(server),
                                         needed=_format_version(MIN_VERSION))
        self._version = min(server, MAX_VERSION)
        LOG.debug('Placement %s: microversion %s', self.endpoint,
                  _format_version(self._version))

    def _send(self, method, url, body=None, ok=(200,), versioned=True,
              not_found=None):
        """Send one request; return its JSON body (None when empty).

        ``not_found``: what to return on 404 instead of raising.
        """
        if versioned and self._version is None:
            self._negotiate()
        if self.before_request is not None:
            self.before_request(PlannedRequest(method, url, body))
        kwargs = {'raise_exc': False}
        if body is not None:
            kwargs['json'] = body
        if versioned:
            kwargs['microversion'] = _format_version(self._version)
        self.stats.by_method[method] += 1
        try:
            resp = self._adapter.request(url, method, **kwargs)
        except ks_exc.ConnectionError as exc:
            raise PlacementUnavailable(endpoint=self.endpoint,
                                       reason=str(exc))
        except (ks_exc.EndpointNotFound, ks_exc.EmptyCatalog) as exc:
            raise PlacementConfigError(
                reason='no Placement endpoint in the service catalog (%s); '
                       'check [placement] region_name / valid_interfaces or '
                       'set endpoint_override' % exc)
        except ks_exc.HttpError as exc:
            # Raised by the auth plugin while fetching a token.
            if exc.http_status in (401, 403):
                raise PlacementAuthError(endpoint=self.endpoint,
                                         reason=str(exc))
            raise PlacementUnavailable(endpoint=self.endpoint,
                                       reason='identity service: %s' % exc)
        except ks_exc.ClientException as exc:
            raise PlacementConfigError(reason=str(exc))
        if resp.status_code in ok:
            if not resp.content:
                return None
            return resp.json()
        if resp.status_code == 404 and not_found is not None:
            return not_found
        raise self._error(method, url, resp)

    def _error(self, method, url, resp):
        code, detail = '-', resp.text[:500]
        try:
            first = resp.json()['errors'][0]
            code = first.get('code', code)
            detail = _clean_detail(first.get('detail', detail))
        except (ValueError, KeyError, IndexError, TypeError):
            pass   # not a Placement error document: keep the raw text
        args = dict(method=method, url=url, status=resp.status_code,
                    code=code, detail=detail)
        if resp.status_code in (401, 403):
            return PlacementAuthError(endpoint=self.endpoint,
                                      reason='HTTP %d on %s %s: %s'
                                      % (resp.status_code, method, url,
                                         detail), **args)
        if resp.status_code >= 500:
            return PlacementServerError(endpoint=self.endpoint,
                                        reason='HTTP %d on %s %s: %s'
                                        % (resp.status_code, method, url,
                                           detail), **args)
        return PlacementError(**args)

    def _retrying(self):
        return tenacity.Retrying(
            stop=tenacity.stop_after_attempt(self.conflict_retries),
            wait=tenacity.wait_random_exponential(
                multiplier=self.retry_wait, max=self.retry_wait_max),
            retry=tenacity.retry_if_exception(_is_concurrent_update),
            reraise=True)

    def _generation_write(self, uuid, what, generation, build):
        """Send ``build(generation)``; on a generation conflict re-read it.

        Returns the provider's new generation.
        """
        try:
            for attempt in self._retrying():
                with attempt:
                    if attempt.retry_state.attempt_number > 1:
                        current = self.get_provider(uuid)
                        if current is None:
                            raise ProviderNotFound(uuid=uuid)
                        LOG.info('Provider %s changed under us (generation '
                                 '%d -> %d); retrying the %s write', uuid,
                                 generation, current.generation, what)
                        generation = current.generation
                    req = build(generation)
                    body = self._send(req.method, req.url, req.body)
        except PlacementError as exc:
            if _is_concurrent_update(exc):
                raise GenerationConflict(uuid=uuid, what=what,
                                         attempts=self.conflict_retries,
                                         **_args(exc))
            raise
        return body['resource_provider_generation']

    # -- request builders (also used by the sync's dry-run plan) -----------

    @staticmethod
    def create_provider_request(name, uuid, parent_uuid):
        body = {'name': name, 'uuid': uuid}
        if parent_uuid is not None:
            body['parent_provider_uuid'] = parent_uuid
        return PlannedRequest('POST', '/resource_providers', body)

    @staticmethod
    def update_provider_request(uuid, name, parent_uuid):
        return PlannedRequest('PUT', '/resource_providers/%s' % uuid,
                              {'name': name,
                               'parent_provider_uuid': parent_uuid})

    @staticmethod
    def inventories_request(uuid, generation, inventories):
        return PlannedRequest(
            'PUT', '/resource_providers/%s/inventories' % uuid,
            {'resource_provider_generation': generation,
             'inventories': {inv.resource_class: inv.to_api()
                             for inv in inventories}})

    @staticmethod
    def traits_request(uuid, generation, traits):
        for trait in traits:
            validate_trait(trait)
        return PlannedRequest(
            'PUT', '/resource_providers/%s/traits' % uuid,
            {'resource_provider_generation': generation,
             'traits': sorted(traits)})

    @staticmethod
    def create_trait_request(name):
        if not objects.is_custom_name(name):
            raise InvalidTrait(trait=name)
        return PlannedRequest('PUT', '/traits/%s' % name)

    @staticmethod
    def delete_provider_request(uuid):
        return PlannedRequest('DELETE', '/resource_providers/%s' % uuid)

    # -- providers -----------------------------------------------------------

    def get_provider(self, uuid):
        """The provider, or None when Placement has none of that uuid."""
        body = self._send('GET', '/resource_providers/%s' % uuid,
                          not_found={})
        return Provider.from_api(body) if body else None

    def find_provider_by_name(self, name):
        query = urllib.parse.urlencode({'name': name})
        body = self._send('GET', '/resource_providers?%s' % query)
        found = body['resource_providers']
        return Provider.from_api(found[0]) if found else None

    def list_tree(self, uuid):
        """Every provider in the tree holding ``uuid`` (empty: no such one)."""
        query = urllib.parse.urlencode({'in_tree': uuid})
        body = self._send('GET', '/resource_providers?%s' % query)
        return tuple(Provider.from_api(p) for p in body['resource_providers'])

    def create_provider(self, name, uuid, parent_uuid=None):
        req = self.create_provider_request(name, uuid, parent_uuid)
        try:
            body = self._send(req.method, req.url, req.body)
        except PlacementError as exc:
            if exc.kwargs.get('status') == 409:
                raise ProviderConflict(name=name, uuid=uuid,
                                       detail=exc.kwargs.get('detail'),
                                       **_args(exc))
            raise
        return Provider.from_api(body)

    def update_provider(self, uuid, name, parent_uuid):
        """Rename or move a provider (moving needs microversion 1.37)."""
        req = self.update_provider_request(uuid, name, parent_uuid)
        body = self._send(req.method, req.url, req.body)
        return Provider.from_api(body)

    def delete_provider(self, uuid):
        req = self.delete_provider_request(uuid)
        try:
            self._send(req.method, req.url, ok=(204,))
        except PlacementError as exc:
            if exc.kwargs.get('status') == 404:
                return   # already gone: what we wanted
            if exc.kwargs.get('code') in (CODE_PROVIDER_INUSE,
                                          CODE_CANNOT_DELETE_PARENT):
                raise ProviderInUse(uuid=uuid,
                                    detail=exc.kwargs.get('detail'),
                                    **_args(exc))
            raise

    # -- inventories ---------------------------------------------------------

    def get_inventories(self, uuid):
        body = self._send('GET', '/resource_providers/%s/inventories' % uuid,
                          not_found={})
        if not body:
            raise ProviderNotFound(uuid=uuid)
        return ProviderInventories(
            generation=body['resource_provider_generation'],
            inventories=tuple(
                _inventory_from_api(rc, inv)
                for rc, inv in sorted(body['inventories'].items())))

    def set_inventories(self, uuid, generation, inventories):
        """Replace all inventories; returns the new generation."""
        try:
            return self._generation_write(
                uuid, 'inventories', generation,
                lambda gen: self.inventories_request(uuid, gen, inventories))
        except PlacementError as exc:
            if exc.kwargs.get('code') == CODE_INVENTORY_INUSE:
                raise InventoryInUse(uuid=uuid,
                                     detail=exc.kwargs.get('detail'),
                                     **_args(exc))
            raise

    # -- traits --------------------------------------------------------------

    def get_traits(self, uuid):
        body = self._send('GET', '/resource_providers/%s/traits' % uuid,
                          not_found={})
        if not body:
            raise ProviderNotFound(uuid=uuid)
        return ProviderTraits(generation=body['resource_provider_generation'],
                              traits=frozenset(body['traits']))

    def missing_custom_traits(self, traits):
        """The CUSTOM_ traits among ``traits`` that Placement lacks."""
        custom = sorted(t for t in set(traits) - self._known_traits
                        if t.startswith('CUSTOM_'))
        if not custom:
            return []
        for name in custom:
            if not objects.is_custom_name(name):
                raise InvalidTrait(trait=name)
        query = urllib.parse.urlencode({'name': 'in:' + ','.join(custom)})
        body = self._send('GET', '/traits?%s' % query)
        present = set(body['traits'])
        self._known_traits.update(present)
        return [t for t in custom if t not in present]

    def create_trait(self, name):
        """Create a custom trait (no-op when it exists)."""
        req = self.create_trait_request(name)
        self._send(req.method, req.url, ok=(201, 204))
        self._known_traits.add(name)

    def set_traits(self, uuid, generation, traits):
        """Replace all traits; returns the new generation."""
        try:
            return self._generation_write(
                uuid, 'traits', generation,
                lambda gen: self.traits_request(uuid, gen, traits))
        except PlacementError as exc:
            if exc.kwargs.get('status') == 400 and 'trait' in str(
                    exc.kwargs.get('detail', '')).lower():
                raise TraitNotFound(traits=sorted(traits),
                                    detail=exc.kwargs.get('detail'),
                                    **_args(exc))
            raise

    # -- allocations ---------------------------------------------------------

    def get_allocations(self, uuid):
        # {"allocations": {"<consumer>": {"resources": {"VGPU": 1}}},
        #  "resource_provider_generation": 7}
        body = self._send('GET', '/resource_providers/%s/allocations' % uuid,
                          not_found={})
        if not body:
            raise ProviderNotFound(uuid=uuid)
        return ProviderAllocations(
            generation=body['resource_provider_generation'],
            consumers=tuple(
                ConsumerAllocation(
                    consumer_uuid=consumer,
                    resources=tuple(sorted(alloc['resources'].items())))
                for consumer, alloc in sorted(body['allocations'].items())))


def _clean_detail(detail):
    """Drop webob's generic first paragraph ("The server could not ...")."""
    paragraphs = [' '.join(p.split()) for p in str(detail).split('\n\n')]
    paragraphs = [p for p in paragraphs if p]
    return (paragraphs[-1] if paragraphs else str(detail)).rstrip('. ')


def _args(exc):
    """The request details of ``exc`` (for re-raising as a narrower type)."""
    return {k: exc.kwargs[k] for k in ('method', 'url', 'status', 'code')
            if k in exc.kwargs}
