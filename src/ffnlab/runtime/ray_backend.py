"""The Ray backend of the executor (`--ray ADDRESS`): actors on the nodes hold the loaded model,
and the units go to the actors as method calls, a few in flight per actor. A node runs one actor
with all its CPUs as threads, or, given threads per worker (`-t N`), CPUs // N actors of N threads:
a grid of small training runs keeps every core busy that way.

    backend = RayBackend.connect("auto")              # or HOST:PORT, ray://HOST:10001, "local", None
    backend = RayBackend.connect("local", threads=1)  # one worker per CPU
    execute(task, units, merge, backend=backend)      # executor.py: the same merge as in-process

The model file (and a LoRA adapter) is read on the driver and put in Ray's object store once; each
node's actor fetches it into that node's store, writes it under the node's temp folder (named by
its sha256, so a second job on the node reuses it) and loads it from there: a model that exists
only on the driver's machine reaches every worker. A worker needs ffnlab and its dependencies
installed, at the driver's version; nothing else.

Faults: a unit whose code raises is a failure of that unit (reported, the others go on). A lost
actor (its node died, its process was killed) is a lost worker: its units in flight go back to the
queue, and a new actor is started on any live node with room for one.

Security: a Ray cluster has no authentication on its dashboard and Jobs API: anyone who reaches the
head runs code on it. `--ray local` binds to 127.0.0.1; docs/scale-out.md says what to do before
pointing ffnlab at a shared cluster.
"""
import contextlib
import hashlib
import os
import re
import socket
import sys
import tempfile
from collections import deque

import numpy as np

from ..errors import UsageError
from .executor import one_line

try:
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
except ImportError:                                   # the optional extra
    ray = None

IN_FLIGHT = 2               # calls queued per actor: the next unit is there when one finishes
                            # (while two rounds of units remain: send() says why)
CONNECT_TIMEOUT_S = 10      # an address nothing listens on is one line, not a hang


def require_ray():
    if ray is None:
        raise UsageError("--ray needs Ray, an optional extra: pip install 'ffnlab[ray]'")


def _probe(address, named):
    """HOST:PORT or ray://HOST:PORT must accept a TCP connection, or UsageError in one line.
    named: where the address came from ('--ray ADDR', 'RAY_ADDRESS=ADDR')."""
    hostport = address.split("://", 1)[-1]
    host, _, port = hostport.rpartition(":")
    if not host or not port.isdigit():
        raise UsageError(f"{named}: expected auto, local, HOST:PORT or ray://HOST:PORT")
    try:
        socket.create_connection((host, int(port)), timeout=CONNECT_TIMEOUT_S).close()
    except OSError as e:
        raise UsageError(f"{named}: nothing answers at {host}:{port} ({e.strerror or e})") from None


def connect(address):
    """ray.init for address: 'local' (a new instance on 127.0.0.1), None (Ray's own rule: RAY_ADDRESS,
    else the cluster `ray start` made on this machine), or what ray.init takes."""
    require_ray()
    if address == "local":
        # Ray turns 127.0.0.1 into the machine's network address and listens on every interface,
        # except where it believes multi-node clusters are off (its Windows/macOS rule): say so for
        # this process, which reads the flag now, and for the GCS, raylet and workers it starts
        os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
        ray._private.ray_constants.ENABLE_RAY_CLUSTER = False
        ray.init(address="local", _node_ip_address="127.0.0.1", dashboard_host="127.0.0.1",
                 log_to_driver=False, configure_logging=False)
        return
    # the flag alone: RAY_ADDRESS, as Ray reads it, else "auto" (a cluster `ray start` made here);
    # never None, which would start a new instance listening on every interface
    target = address or os.environ.get("RAY_ADDRESS") or "auto"
    named = f"--ray {address}" if address else (f"RAY_ADDRESS={target}" if target != "auto" else "--ray")
    if target != "auto":
        _probe(target, named)
    try:
        ray.init(address=target, log_to_driver=False, configure_logging=False)
    except ConnectionError as e:
        raise UsageError(f"{named}: no Ray cluster found ({one_line(e)}); give its address, or --ray local for "
                         f"a new one on this machine (docs/scale-out.md)") from None


def _ship(path):
    """A file or a directory on the driver -> {relative path: (sha256, object ref)} in the object store."""
    if path is None:
        return None
    root = os.path.abspath(path)
    names = ([os.path.basename(root)] if os.path.isfile(root) else
             sorted(os.path.relpath(os.path.join(d, f), root) for d, _, fs in os.walk(root) for f in fs))
    base = os.path.dirname(root) if os.path.isfile(root) else root
    out = {}
    for rel in names:
        with open(os.path.join(base, rel), "rb") as f:
            data = np.frombuffer(f.read(), dtype=np.uint8)           # a NumPy buffer: read zero-copy on the node
        out[rel] = (hashlib.sha256(data).hexdigest(), ray.put(data))
    return {"dir": os.path.isdir(root), "files": out}


def _unpack(shipped, root):
    """On a worker: the shipped files -> a local path (written once per node, reused after)."""
    if shipped is None:
        return None
    digest = hashlib.sha256("".join(sha for sha, _ in shipped["files"].values()).encode()).hexdigest()[:16]
    folder = os.path.join(root, digest)
    for rel, (sha, ref) in shipped["files"].items():
        dst = os.path.join(folder, rel)
        if not os.path.exists(dst):
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            data = ray.get(ref)
            tmp = f"{dst}.tmp-{os.getpid()}"
            with open(tmp, "wb") as f:
                f.write(data.tobytes())
            del data
            os.replace(tmp, dst)                                      # atomic: another actor may race us
    if shipped["dir"]:
        return folder
    return os.path.join(folder, next(iter(shipped["files"])))


class ModelHost:
    """One per node: loads the model once, then runs units. (Made a Ray actor in RayBackend.)"""

    def __init__(self, threads):
        from .. import __version__
        from ..threads import set_threads
        set_threads(threads)
        self.version, self.node = __version__, ray.util.get_node_ip_address()
        self.model = None

    def load(self, spec, model_files, lora_files):
        """The model, from the files the driver shipped (after the driver checked this worker's version)."""
        if spec is not None:
            root = os.path.join(tempfile.gettempdir(), "ffnlab-ray-models")
            self.model = spec.load(_unpack(model_files, root), _unpack(lora_files, root))

    def info(self):
        import resource
        return {"ffnlab": self.version, "node": self.node, "pid": os.getpid(),
                "rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}

    def run(self, fn, params, payload):
        return fn(self.model, params, payload)


class RayBackend:
    name = "ray"

    def __init__(self, workers=None, threads=None):
        self.workers = workers             # at most this many actors in all (None: as many as the nodes hold)
        self.threads = threads             # threads of each actor (None: one actor per node, all its CPUs)
        self.actors = {}                   # (node id, slot) -> actor handle
        self.infos = {}                    # (node id, slot) -> info() of its actor
        self.lost = set()                  # nodes where an actor died: no new actor there in this job
        self.shipped = None                # (model files, LoRA files) in the object store, once per job

    @classmethod
    def connect(cls, address, workers=None, threads=None):
        """address: as connect() takes it; workers: a cap on the actors; threads: each actor's threads."""
        connect(address)
        return cls(workers, threads)

    # --- the actors --------------------------------------------------------------------------
    def _live_nodes(self):
        return [n for n in ray.nodes() if n.get("Alive") and n.get("Resources", {}).get("CPU", 0) >= 1]

    def slots(self, cpus):
        """-> (actors, threads of each) for a node of `cpus` CPUs"""
        per = self.threads or cpus
        return max(1, cpus // per), per

    def _start_actors(self, task):
        """Actors on the live nodes' free slots (up to `workers` in all); -> the slots that joined.
        The actors go round the nodes slot by slot, so a cap of N workers spreads over N nodes."""
        host = ray.remote(max_restarts=0, max_task_retries=0)(ModelHost)
        pending = {}
        nodes = [n for n in self._live_nodes() if n["NodeID"] not in self.lost]
        layout = {n["NodeID"]: self.slots(int(n["Resources"]["CPU"])) for n in nodes}
        for slot in range(max((k for k, _ in layout.values()), default=0)):
            for n in nodes:
                key, (k, per) = (n["NodeID"], slot), layout[n["NodeID"]]
                if slot >= k or key in self.actors:
                    continue
                if self.workers is not None and len(self.actors) + len(pending) >= self.workers:
                    break
                cpus = min(per, int(n["Resources"]["CPU"]))
                a = host.options(num_cpus=cpus, scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"],
                                                                                                   soft=False)
                                 ).remote(per)
                pending[key] = (a, f"{n.get('NodeManagerAddress', '?')} ({n['NodeID'][:8]})")
        if self.shipped is None:           # read, hashed and put while the actors' processes start
            self.shipped = (_ship(task.model.path), _ship(task.model.lora)) if task.model is not None else (None, None)
        for key, (a, where) in pending.items():
            try:
                info = ray.get(a.info.remote())
            except ray.exceptions.RayActorError as e:
                raise UsageError(f"node {where}: cannot start an ffnlab worker ({_cause(e)}); "
                                 f"install ffnlab {_version()} there") from None
            if info["ffnlab"] != _version():
                raise UsageError(f"node {where}: ffnlab {info['ffnlab']} is installed there, the driver runs "
                                 f"{_version()}; install the same version on every node")
            self.infos[key] = info
        # every actor checked: now the model goes out (once into each node's store, loaded by each actor)
        loads = {key: a.load.remote(task.model, *self.shipped) for key, (a, _) in pending.items()}
        for key, ref in loads.items():
            try:
                ray.get(ref)
            except ray.exceptions.RayActorError:                      # the node died while loading: not used
                self.lost.add(key[0])
                self.infos.pop(key, None)
                continue
            except ray.exceptions.RayTaskError as e:
                raise UsageError(f"node {pending[key][1]}: cannot load {task.model.path} ({_cause(e)})") from None
            self.actors[key] = pending[key][0]
        return list(pending)

    def run(self, task, units, on_result, on_failure, on_retry):
        # Ray prints cluster events (a raylet that died, a worker's logs) with print(): onto stderr,
        # so that stdout holds only the command's result (--json)
        with contextlib.redirect_stdout(sys.stderr):
            self._run(task, units, on_result, on_failure, on_retry)

    def _run(self, task, units, on_result, on_failure, on_retry):
        if not units:
            return
        self._start_actors(task)
        if not self.actors:
            raise UsageError("the Ray cluster has no live node with a CPU to run an ffnlab worker")
        queue, flight = deque(units), {}                             # ref -> ((node id, slot), unit)

        def send():
            # every idle actor gets a unit first; an actor gets a second, queued behind its running one,
            # only while two rounds of units remain: near the end a unit queued behind a running one
            # waits there while another actor sits idle (8 units on 2 actors could end with one unit
            # running alone), and there a dispatch's few milliseconds cost less than that wait
            for depth in range(1, IN_FLIGHT + 1):
                for key, a in list(self.actors.items()):
                    if not queue or (depth > 1 and len(queue) < 2 * len(self.actors)):
                        return
                    if sum(1 for k, _ in flight.values() if k == key) < depth:
                        u = queue.popleft()
                        flight[a.run.remote(task.fn, task.params, u.payload)] = (key, u)

        send()
        while flight:
            [ref], _ = ray.wait(list(flight), num_returns=1)
            key, u = flight.pop(ref)
            try:
                result = ray.get(ref)
            except ray.exceptions.RayActorError:                     # the worker is gone, not the unit's fault
                self._lose(key, u, queue, flight, on_retry)
                if not self.actors:
                    self._start_actors(task)
                if not self.actors:
                    for v in [u for _, u in flight.values()] + list(queue):
                        on_failure(v, "no live Ray node is left to run it")
                    return
            except ray.exceptions.RayTaskError as e:
                on_failure(u, _cause(e))
            else:
                on_result(u, result)
            send()
        for key, a in self.actors.items():                           # peak RSS after the work, per worker
            self.infos[key] = ray.get(a.info.remote())

    def _lose(self, key, unit, queue, flight, on_retry):
        """The actor at key died: its units in flight go back to the front of the queue."""
        self.actors.pop(key, None)
        self.lost.add(key[0])
        back = [unit] + [v for ref, (k, v) in list(flight.items()) if k == key]
        for ref in [r for r, (k, _) in flight.items() if k == key]:
            flight.pop(ref)
        for v in sorted(back, key=lambda v: v.id, reverse=True):
            queue.appendleft(v)
            on_retry()

    def worker_info(self):
        return [self.infos[n] for n in sorted(self.infos)]

    def close(self):
        """Kills the actors and disconnects (a `--ray local` instance stops with it)."""
        with contextlib.redirect_stdout(sys.stderr):
            for a in self.actors.values():
                ray.kill(a)
            self.actors = {}
            ray.shutdown()


def _cause(e):
    """A Ray error -> the error it carries, in one line: its cause, else the innermost `XError: ...` line of
    its text (an actor that died in its creation task holds the worker's traceback as text, colours and all)."""
    cause = getattr(e, "cause", None)
    if isinstance(cause, BaseException):
        return one_line(cause)
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(e))
    errors = [ln.strip() for ln in text.splitlines() if re.match(r"\s*[A-Za-z_.]*(Error|Exception): \S", ln)]
    return errors[-1] if errors else one_line(e).split(" Traceback")[0]


def _version():
    from .. import __version__
    return __version__
