"""Getting a hub id's files onto this machine with every network wait bounded: a cached copy first, else one
short reachability probe, else a watched download of only the files a load reads.

Hub ids are looked up in the local Hugging Face cache first (:mod:`core.models.hub_cache`)
and a complete cached copy is used without touching the network. Only when
nothing usable is cached is the hub asked: at once refused when
``HF_HUB_OFFLINE``/``TRANSFORMERS_OFFLINE`` is set, else after one short
reachability probe (about 1.5 s), so an offline machine says what is missing
right away instead of retrying for half a minute.

Every network wait is bounded, and no lock is held across one. The probe's
connect waits at most 1.5 s; a download then runs in a worker thread that the
loader watches, and when the hub sends nothing for :data:`HUB_WAIT_S` (20 s)
the load stops with one line naming the host (a server that accepts and never
answers would otherwise hold the caller for minutes: huggingface_hub reads the
repo's metadata with no timeout and retries the rest). The download happens
before any lock is taken, and one download of a repo is shared by every load
that needs it; the local load that follows (:mod:`core.models.loading`) holds
only that model's own lock, so a stalled hub never delays a session that opens a
folder or the bundled model. Only the files a load reads are downloaded: config,
card, tokenizer and safetensors files, never a pickle.
"""

from __future__ import annotations

import os
import socket
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path

from core.errors import ModelLoadError
from core.models.hub_cache import _TRUE, cached_snapshot, hub_cache_dir, hub_offline
from core.models.names import APP_MODEL_BOX, _is_dir
from core.models.safety import TOKENIZER_FILES, WEIGHT_FILES, _has_weights


def _hub_address() -> tuple[str, int]:
    """Host and port a hub request would connect to first: the HTTPS proxy if one is set, else the endpoint."""
    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/")
    parsed = urllib.parse.urlsplit(endpoint)
    host = parsed.hostname or "huggingface.co"
    port = parsed.port or (80 if parsed.scheme == "http" else 443)
    proxy = urllib.request.getproxies().get(parsed.scheme or "https")
    if proxy and not urllib.request.proxy_bypass(host):
        p = urllib.parse.urlsplit(proxy if "://" in proxy else "http://" + proxy)
        if p.hostname:
            return p.hostname, p.port or (443 if p.scheme == "https" else 80)
    return host, port


_REACH: dict[tuple[str, int], tuple[float, bool]] = {}
_REACH_TTL = 30.0


def hub_reachable(timeout: float = 1.5) -> bool:
    """One TCP connect to the hub (or its proxy), bounded by ``timeout`` seconds including DNS.

    The connect runs in a daemon thread so a hanging name lookup cannot hold
    the caller longer than ``timeout``; the answer is remembered for 30 s.
    """
    addr = _hub_address()
    seen = _REACH.get(addr)
    if seen and time.monotonic() - seen[0] < _REACH_TTL:
        return seen[1]
    result: list[bool] = []

    def probe() -> None:
        try:
            with socket.create_connection(addr, timeout=timeout):
                result.append(True)
        except OSError:
            result.append(False)

    worker = threading.Thread(target=probe, daemon=True, name="hub-probe")
    worker.start()
    worker.join(timeout + 0.2)
    ok = bool(result and result[0])
    _REACH[addr] = (time.monotonic(), ok)
    return ok


def _not_here(repo_id: str, why: str, app_why: str | None = None) -> ModelLoadError:
    short = repo_id.rstrip("/").split("/")[-1]
    return ModelLoadError(
        f"Model '{repo_id}' is not on this machine and {why}: download it where there is internet "
        f"(`hf download {repo_id} --local-dir ./{short}`) and pass that folder (--model ./{short}, or the app's "
        f"'hub id or folder' box), or set HF_HOME to a Hugging Face cache that holds it (looked in {hub_cache_dir()}).",
        app=f"Model '{repo_id}' is not on this machine and {app_why or why}: download it on a machine with internet, "
        f"copy its folder onto this machine and type that folder in {APP_MODEL_BOX}.",
    )


def locate(source: str) -> tuple[str, bool]:
    """Where to load ``source`` from: ``(folder, True)`` for a local folder or a complete
    cached hub snapshot, ``(hub id, False)`` when it must be downloaded and the hub answers.

    Raises :class:`ModelLoadError` at once (no retries) when a hub id has no
    usable local copy and offline mode is on or the hub cannot be reached.
    """
    if _is_dir(source):
        return source, True
    snap = cached_snapshot(source)
    if snap is not None and _has_weights(snap):
        return str(snap), True
    partial = f" (the cached copy in {snap} has no {WEIGHT_FILES[0]})" if snap is not None else ""
    if hub_offline():
        flag = (
            "HF_HUB_OFFLINE"
            if os.environ.get("HF_HUB_OFFLINE", "").strip().upper() in _TRUE
            else "TRANSFORMERS_OFFLINE"
        )
        raise _not_here(source, f"offline mode is on ({flag}){partial}", "the app runs offline")
    if not hub_reachable():
        host = _hub_address()[0]
        raise _not_here(
            source,
            f"the Hugging Face hub ({host}) cannot be reached{partial}",
            f"the Hugging Face hub ({host}) cannot be reached from it",
        )
    return source, False


#: The longest the loader waits on the hub without receiving a byte, in seconds (after the 1.5 s connect probe of
#: :func:`hub_reachable`). A download that keeps receiving may take as long as it needs; one that stalls this long
#: stops with one line naming the host. huggingface_hub's own timeouts do not bound it: its metadata request has none
#: (a server that accepts and never answers holds it for good), and the file requests are retried.
HUB_WAIT_S = 20.0
#: How often the loader looks at a download's progress, in seconds.
_POLL_S = 0.25
#: Files of a hub repo that a load reads (anything else, pickled weights above all, is never downloaded).
_HUB_EXTRA_FILES = (
    "config.json",
    "generation_config.json",
    "card.json",
    "special_tokens_map.json",
    "added_tokens.json",
)


def _hub_endpoint() -> str:
    """The hub's base URL as the environment says now (``HF_ENDPOINT``; huggingface_hub froze it at import)."""
    return os.environ.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/")


def _hub_file_wanted(name: str) -> bool:
    """A repo file a load reads: at the top level, and config, card, tokenizer or safetensors."""
    return "/" not in name and (
        name in _HUB_EXTRA_FILES
        or name in TOKENIZER_FILES
        or name.endswith((".safetensors", ".safetensors.index.json"))
    )


class _Download:
    """One hub download in flight, shared by every load that needs the same repo.

    ``last`` is when the hub last sent something (a byte of a file, a file done,
    the file list); the loaders waiting on it give up when it is older than
    :data:`HUB_WAIT_S`, and a loader that arrives later fails at once.
    """

    def __init__(self, repo_id: str, endpoint: str, cache_dir: Path) -> None:
        self.repo_id, self.endpoint, self.cache_dir = repo_id, endpoint, cache_dir
        self.last = time.monotonic()
        self.done = threading.Event()
        self.folder: Path | None = None
        self.error: BaseException | None = None

    def tick(self) -> None:
        self.last = time.monotonic()

    def run(self) -> None:
        """The worker thread: the file list, then each wanted file into the hub cache (its snapshot folder)."""
        try:
            from huggingface_hub import HfApi, hf_hub_download
            from huggingface_hub.utils import tqdm as hub_tqdm

            download = self

            class Progress(hub_tqdm):  # each chunk received counts as the hub answering
                def update(self, n=1):
                    download.tick()
                    return super().update(n)

            info = HfApi(endpoint=self.endpoint).model_info(self.repo_id, timeout=HUB_WAIT_S)
            self.tick()
            names = sorted(s.rfilename for s in (info.siblings or []) if _hub_file_wanted(s.rfilename))
            for name in names:
                path = hf_hub_download(
                    self.repo_id,
                    name,
                    cache_dir=str(self.cache_dir),
                    endpoint=self.endpoint,
                    etag_timeout=HUB_WAIT_S,
                    tqdm_class=Progress,
                )
                self.tick()
                self.folder = Path(path).parent
            if self.folder is None:
                self.error = ModelLoadError(
                    f"The hub's copy of '{self.repo_id}' holds none of config.json, model.safetensors or tokenizer "
                    "files: only safetensors weights are loaded."
                )
        except BaseException as err:  # noqa: BLE001 - handed to the waiting loaders, who word it
            self.error = err
        finally:
            self.done.set()
            with _LOCK:
                if _DOWNLOADS.get(self.key) is self:
                    del _DOWNLOADS[self.key]

    @property
    def key(self) -> tuple[str, str, str]:
        return self.endpoint, self.repo_id, str(self.cache_dir)


#: The downloads in flight, one per (endpoint, repo, cache folder), shared by every load that needs that repo.
_DOWNLOADS: dict[tuple[str, str, str], _Download] = {}
#: Guards ``_DOWNLOADS``; held only for a dict operation, never across a network wait (it once was held for a
#: whole download, and every other session's load waited on a stalled hub).
_LOCK = threading.Lock()


def _tree_bytes(folder: Path) -> int:
    """Bytes under ``folder`` (a download's cache folder): growth there also counts as the hub answering."""
    total = 0
    for root, _dirs, files in os.walk(folder):
        for f in files:
            try:
                total += os.lstat(os.path.join(root, f)).st_size
            except OSError:
                pass
    return total


def _hub_failed(repo_id: str, err: BaseException) -> ModelLoadError:
    """The one line for a download that ended in an error (not found, refused, timed out)."""
    if isinstance(err, ModelLoadError):
        return err
    host, port = _hub_address()
    kind = type(err).__name__
    if "Timeout" in kind or isinstance(err, TimeoutError):
        return _stalled(repo_id)
    if kind in ("RepositoryNotFoundError", "GatedRepoError", "RevisionNotFoundError"):
        return _not_here(
            repo_id,
            f"the Hugging Face hub ({host}) has no model '{repo_id}' that it lets us read ({kind})",
            f"the Hugging Face hub has no model '{repo_id}' that it lets us read",
        )
    first = (str(err).splitlines() or [""])[0][
        :160
    ]  # the CLI's line may name the URL; the app's names no server detail
    return _not_here(
        repo_id,
        f"its download from the Hugging Face hub ({host}:{port}) failed ({kind}: {first})",
        f"its download from the Hugging Face hub failed ({kind})",
    )


def _stalled(repo_id: str) -> ModelLoadError:
    host, port = _hub_address()
    why = f"the Hugging Face hub at {host}:{port} sent nothing for {HUB_WAIT_S:g} s"
    return _not_here(repo_id, why, f"the Hugging Face hub ({host}) sent nothing for {HUB_WAIT_S:g} s")


def fetch(repo_id: str) -> Path:
    """Download what a load of hub repo ``repo_id`` reads into the hub cache; its snapshot folder.

    Bounded: the download runs in a daemon worker thread, and this returns or
    raises a one-line :class:`ModelLoadError` as soon as the hub has sent
    nothing for :data:`HUB_WAIT_S` seconds (a worker stuck on a silent server is
    left to end on its own). No lock is held while waiting, and loads of the
    same repo share one download.
    """
    cache = hub_cache_dir()
    endpoint = _hub_endpoint()
    with _LOCK:
        dl = _DOWNLOADS.get((endpoint, repo_id, str(cache)))
        if dl is None:
            dl = _Download(repo_id, endpoint, cache)
            _DOWNLOADS[dl.key] = dl
            threading.Thread(target=dl.run, daemon=True, name=f"hub-download {repo_id}"[:60]).start()
    repo_dir = cache / ("models--" + repo_id.replace("/", "--"))
    size = -1
    while not dl.done.wait(_POLL_S):
        now_size = _tree_bytes(repo_dir)
        if now_size != size:
            if size >= 0:
                dl.tick()
            size = now_size
        if time.monotonic() - dl.last > HUB_WAIT_S:
            raise _stalled(repo_id)
    if dl.error is not None:
        raise _hub_failed(repo_id, dl.error) from None
    assert dl.folder is not None
    return dl.folder


def local_copy(source: str) -> str:
    """A folder holding ``source``: itself, its complete cached snapshot, or a bounded download (:func:`fetch`)."""
    where, local = locate(source)
    return where if local else str(fetch(where))
