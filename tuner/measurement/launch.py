"""TrialConfig -> argv: the one pure function that decides how llama-server is launched.

The argv is ``[numactl ...] llama-server --model TARGET [flags]``: a list, never a
shell string, so no configuration value can inject shell syntax. ``server_process`` appends
``--host``/``--port`` (it picks the port); the full command is stored with every trial
and exported as the production command.

Pinning (documented order): threads go one per physical core, node by node, lowest
sibling first (``cpus_for_threads``); SMT siblings only when the space sets
``allow_smt``. With numactl the CPUs are fixed by ``--physcpubind`` and the memory
policy by ``--interleave=all`` (interleave) or ``--membind=N`` (bind, CPUs taken from
node N); llama.cpp is then told ``--numa numactl`` so it follows numactl's CPU map.
``distribute``/``isolate`` are llama.cpp's own ``--numa`` strategies. Without numactl
the CPUs are pinned by llama.cpp itself (``--cpu-mask`` with ``--cpu-strict 1``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from tuner.errors import UserError
from tuner.knobs.config import TrialConfig
from tuner.knobs.registry import NUMA_POLICIES
from tuner.machine.topology import Topology, format_cpu_list, parse_cpu_list
from tuner.measurement.failures import FailureReason, TrialFailure

# Which flag carries the draft length K for each speculative type of the pinned build.
K_FLAGS = {
    "draft-simple": "--spec-draft-n-max",
    "ngram-simple": "--spec-ngram-simple-size-m",
    "ngram-map-k": "--spec-ngram-map-k-size-m",
    "ngram-map-k4v": "--spec-ngram-map-k4v-size-m",
    "ngram-mod": "--spec-ngram-mod-n-max",
    "draft-mtp": "--spec-draft-n-max",
}
MIN_FLAGS = {"draft-simple": "--spec-draft-n-min", "ngram-mod": "--spec-ngram-mod-n-min"}


# ---------------------------------------------------------------- pinning policy


def _ordered_core_groups(topo: Topology, node: int | None) -> list[tuple[int, ...]]:
    """Sibling groups ordered node by node, then package, then core id."""
    by_id = {cpu.id: cpu for cpu in topo.cpus}
    if node is not None:
        topo.node(node)  # raises a UserError naming the existing nodes
    groups = [g for g in topo.smt_siblings if node is None or by_id[g[0]].node == node]

    def key(group: tuple[int, ...]) -> tuple[int, int, int, int]:
        first = by_id[group[0]]
        return (first.node, first.package, first.core, first.id)

    return sorted(groups, key=key)


def physical_core_order(topo: Topology, node: int | None = None) -> list[int]:
    """One logical CPU per physical core (its lowest-numbered sibling).

    Ordered node by node, then by package and core, so taking the first N keeps
    threads on as few nodes as possible (local memory, one set of caches). With
    ``node`` only that node's cores are returned.
    """
    return [group[0] for group in _ordered_core_groups(topo, node)]


def cpus_for_threads(
    topo: Topology, n_threads: int, node: int | None = None, allow_smt: bool = False
) -> list[int]:
    """The CPUs to pin ``n_threads`` threads to: every physical core before any sibling.

    More threads than physical cores is an error unless ``allow_smt``; then the second
    sibling of every core (in core order) is used, then the third, and so on. SMT
    siblings share a core's execution units, so they rarely speed up decode.
    """
    where = f"NUMA node {node}" if node is not None else "this machine"
    groups = _ordered_core_groups(topo, node)
    if n_threads < 1:
        raise UserError(f"thread count must be at least 1, got {n_threads}")
    if n_threads <= len(groups):
        return [group[0] for group in groups[:n_threads]]
    if not allow_smt:
        raise UserError(
            f"{n_threads} threads requested but {where} has {len(groups)} physical cores; "
            f"use at most {len(groups)} threads (or allow SMT siblings)"
        )
    order = [group[0] for group in groups]
    for rank in range(1, max(len(g) for g in groups)):
        order.extend(group[rank] for group in groups if len(group) > rank)
    if n_threads > len(order):
        raise UserError(f"{n_threads} threads requested but {where} has {len(order)} logical CPUs")
    return order[:n_threads]


def meaningful_numa_policies(topo: Topology) -> list[str]:
    """The NUMA policies worth trying on this machine.

    With one node they all collapse to "none": numactl interleave or bind over a single
    node is the default allocation, and llama.cpp's --numa distribute/isolate only
    change anything when there are several nodes. Trying them would spend trials
    measuring noise.
    """
    return list(NUMA_POLICIES) if len(topo.nodes) > 1 else ["none"]


# ---------------------------------------------------------------- argv


@dataclass(frozen=True)
class LaunchContext:
    """What is fixed for a whole study: binaries, models, machine, server settings."""

    server_binary: Path
    target: Path
    drafts: dict[str, Path]
    expert_override_key: str | None
    topology: Topology
    numactl: str | None
    ctx_size: int
    allow_smt: bool = False
    extra_args: tuple[str, ...] = ()
    slots: int = 1  # --parallel when the configuration does not set it: the study's highest concurrency
    chat: bool = False  # the workload holds conversations: served through the chat template (--jinja)
    chat_template: Path | None = None  # the study's template file; None: the target's own
    # the target's llama-quantize variants by type (the knob target_quant); "source" and None: ``target``
    target_variants: dict[str, Path] = field(default_factory=dict)
    # the long flags the build's llama-server lists (``machine.llama_build.server_flags``); empty: not read, and
    # nothing checked. ``build``: that build in words, for the error naming a flag it lacks
    server_flags: frozenset[str] = frozenset()
    build: str = ""

    def target_file(self, config: TrialConfig) -> Path:
        """The target file ``config`` runs: its variant's, or the study's target as given."""
        return self.target_variants.get(config.target_quant or "", self.target)

    def model_files(self, config: TrialConfig) -> list[Path]:
        """The files a launch of ``config`` maps, whose cached pages follow its NUMA policy: its target, the drafts."""
        return [self.target_file(config), *self.drafts.values()]


def pinned_cpus(config: TrialConfig, ctx: LaunchContext) -> list[int]:
    """A CPU for every thread of the larger pool: llama.cpp runs prompts and every batch of more than one token
    (a speculative verification) on ``--threads-batch`` threads, so pinning those to ``--threads`` CPUs
    oversubscribes them, and decode slows by a multiple (evidence: docs/decisions.md#batch-threads-pinned)."""
    node = config.numa_node if config.numa == "bind" else None
    threads = max(config.threads, config.threads_batch or config.threads)
    try:
        return cpus_for_threads(ctx.topology, threads, node=node, allow_smt=ctx.allow_smt)
    except UserError as err:
        raise TrialFailure(FailureReason.INVALID_CONFIG, str(err)) from err


def cpu_mask(cpus: list[int]) -> str:
    return hex(sum(1 << cpu for cpu in cpus))


def asked_cpus(argv: Sequence[str]) -> frozenset[int]:
    """The CPUs an argv pins its server to, read back as ``build_server_command`` writes them (numactl's
    ``--physcpubind=``, else llama.cpp's ``--cpu-mask``), or a preset section's; empty when it pins nothing."""
    for at, item in enumerate(argv):
        if item.startswith("--physcpubind="):
            return frozenset(parse_cpu_list(item.partition("=")[2]))
        if item == "--cpu-mask" and at + 1 < len(argv):
            try:
                mask = int(argv[at + 1], 16)
            except ValueError:
                return frozenset()
            return frozenset(cpu for cpu in range(mask.bit_length()) if mask >> cpu & 1)
    return frozenset()


def compute_threads(argv: Sequence[str]) -> int:
    """How many threads an argv's server computes on: the larger of ``--threads`` and ``--threads-batch`` (1 when
    neither is given or readable)."""
    counts = [1]
    for at, item in enumerate(argv[:-1]):
        if item in ("--threads", "--threads-batch", "-t", "-tb") and argv[at + 1].isdigit():
            counts.append(int(argv[at + 1]))
    return max(counts)


@dataclass(frozen=True)
class ServerCommand:
    """One trial's llama-server command, structured: what an export turns into a preset section."""

    prefix: tuple[str, ...]  # numactl and its options; empty without numactl
    binary: str
    options: tuple[tuple[str, str | None], ...]  # (flag, value) in order; None for a switch
    extra: tuple[str, ...] = ()  # the study's llama_cpp.extra_args, verbatim
    cpus: tuple[int, ...] = ()  # the pinned CPUs

    def with_slots(self, users: int) -> ServerCommand:
        """The command serving ``users`` at once: ``--parallel`` slots for each of them (a load class's
        export and its race)."""
        options = tuple((flag, str(users) if flag == "--parallel" else value) for flag, value in self.options)
        if not any(flag == "--parallel" for flag, _ in options):
            options += (("--parallel", str(users)),)
        return replace(self, options=options)

    @property
    def argv(self) -> list[str]:
        flat = [
            item for flag, value in self.options for item in ((flag,) if value is None else (flag, value))
        ]
        return [*self.prefix, self.binary, *flat, *self.extra]

    def to_json(self) -> dict:
        return {
            "prefix": list(self.prefix),
            "binary": self.binary,
            "options": [list(o) for o in self.options],
            "extra": list(self.extra),
            "cpus": list(self.cpus),
        }

    @classmethod
    def from_json(cls, data: dict) -> ServerCommand:
        return cls(
            tuple(data["prefix"]),
            data["binary"],
            tuple((f, v) for f, v in data["options"]),
            tuple(data.get("extra", ())),
            tuple(data.get("cpus", ())),
        )


def build_server_command(config: TrialConfig, ctx: LaunchContext) -> ServerCommand:
    """The command of one trial's llama-server; ``server_process`` appends --host/--port."""
    cpus = pinned_cpus(config, ctx)
    prefix: list[str] = []
    pinning: list[tuple[str, str | None]] = []
    if ctx.numactl:
        prefix = [ctx.numactl, f"--physcpubind={format_cpu_list(cpus)}"]
        if config.numa == "interleave":
            prefix.append("--interleave=all")
        elif config.numa == "bind":
            prefix.append(f"--membind={config.numa_node}")
        if config.numa in ("interleave", "bind"):
            pinning.append(("--numa", "numactl"))
    else:
        if config.numa in ("interleave", "bind"):
            raise TrialFailure(FailureReason.INVALID_CONFIG, f"numa={config.numa} needs numactl; install it")
        pinning += [("--cpu-mask", cpu_mask(cpus)), ("--cpu-strict", "1")]
    if config.numa in ("distribute", "isolate"):
        pinning.append(("--numa", config.numa))
    options = [
        *model_options(config, ctx),
        ("--ctx-size", str(ctx.ctx_size)),
        ("--parallel", str(config.parallel or ctx.slots)),
        ("--no-webui", None),
        *chat_options(ctx),
        *serving_options(config),
        *memory_options(config),
        *pinning,
        *speculative_options(config, ctx),
    ]
    options += for_build(options, config, ctx)
    return ServerCommand(
        tuple(prefix), str(ctx.server_binary), tuple(options), tuple(ctx.extra_args), tuple(cpus)
    )


NO_SPECULATION = "--no-spec-type"


def for_build(
    options: list[tuple[str, str | None]], config: TrialConfig, ctx: LaunchContext
) -> list[tuple[str, str | None]]:
    """What the build in use needs beyond ``options``, read from its own ``--help`` (``ctx.server_flags``): a
    configuration without speculation says so (``--no-spec-type``) where the build has the switch, since such a
    build may speculate by default (an upstream change turns ngram-mod on by default); a flag of ours that
    the build does not list is one line naming the build and the flag, never a launch that fails or, worse, one
    that ignores it. Nothing without the build's flags."""
    if not ctx.server_flags:
        return []
    added: list[tuple[str, str | None]] = []
    if not config.speculative and NO_SPECULATION in ctx.server_flags:
        added.append((NO_SPECULATION, None))
    for flag, _ in options:
        if flag.startswith("--") and flag not in ctx.server_flags:
            raise UserError(
                f"{ctx.build or ctx.server_binary.parent}: its llama-server does not list {flag} in --help; "
                "use the pinned build (`make llama`, LLAMA_CPP_BIN unset) or a build that has it"
            )
    return added


def chat_options(ctx: LaunchContext) -> list[tuple[str, str | None]]:
    """A chat workload is served as production serves chat: the Jinja engine on the model's template,
    or the study's template file."""
    if not ctx.chat:
        return []
    return [("--jinja", None)] + (
        [("--chat-template-file", str(ctx.chat_template))] if ctx.chat_template else []
    )


def build_server_argv(config: TrialConfig, ctx: LaunchContext) -> list[str]:
    return build_server_command(config, ctx).argv


def model_options(config: TrialConfig, ctx: LaunchContext) -> list[tuple[str, str]]:
    """The options that decide what the target computes: shared with llama-perplexity."""
    options = [
        ("--model", str(ctx.target_file(config))),
        ("--threads", str(config.threads)),
        ("--threads-batch", str(config.threads_batch or config.threads)),
    ]
    if config.experts is not None and ctx.expert_override_key:
        options.append(("--override-kv", expert_override(ctx.expert_override_key, config.experts)))
    return options + attention_options(config)


def attention_options(config: TrialConfig) -> list[tuple[str, str]]:
    """Flash attention and the KV cache types: they change the logits (a quantized cache most), so they
    are model options, passed to llama-perplexity too and scored like the experts."""
    flags = (
        ("--flash-attn", config.flash_attn),
        ("--cache-type-k", config.cache_type_k),
        ("--cache-type-v", config.cache_type_v),
    )
    return [(flag, value) for flag, value in flags if value is not None]


def serving_options(config: TrialConfig) -> list[tuple[str, str]]:
    """Batch sizes, polling and prompt-cache reuse: how the server schedules work, not what it computes."""
    flags = (
        ("--batch-size", config.batch),
        ("--ubatch-size", config.ubatch),
        ("--poll", config.poll),
        ("--cache-reuse", config.cache_reuse),
    )
    return [(flag, str(value)) for flag, value in flags if value is not None]


# The pinned build's --load-mode for (mmap, mlock); it has no --mmap/--no-mmap/--mlock switches.
LOAD_MODES = {
    ("on", "off"): "mmap",
    ("off", "off"): "none",
    ("on", "on"): "mmap+mlock",
    ("off", "on"): "mlock",
}


def memory_options(config: TrialConfig) -> list[tuple[str, str]]:
    """How the server holds the weights: ``--load-mode`` when mmap or mlock is set (a knob left unset keeps
    llama.cpp's default: mapped, not locked); nothing when neither is, llama.cpp's own default."""
    if config.mmap is None and config.mlock is None:
        return []
    return [("--load-mode", LOAD_MODES[(config.mmap or "on", config.mlock or "off")])]


def expert_override(key: str, experts: int) -> str:
    """``--override-kv`` value that sets the active expert count (key from the GGUF's architecture)."""
    return f"{key}=int:{experts}"


def model_flags(config: TrialConfig, ctx: LaunchContext) -> list[str]:
    return [item for pair in model_options(config, ctx) for item in pair]


# Per n-gram type: the flags of its key length, draft length and minimum hits (ngram-mod: match length, n-max).
NGRAM_FLAGS = {
    "ngram-simple": (
        "--spec-ngram-simple-size-n",
        "--spec-ngram-simple-size-m",
        "--spec-ngram-simple-min-hits",
    ),
    "ngram-map-k": ("--spec-ngram-map-k-size-n", "--spec-ngram-map-k-size-m", "--spec-ngram-map-k-min-hits"),
    "ngram-map-k4v": (
        "--spec-ngram-map-k4v-size-n",
        "--spec-ngram-map-k4v-size-m",
        "--spec-ngram-map-k4v-min-hits",
    ),
    "ngram-mod": ("--spec-ngram-mod-n-match", "--spec-ngram-mod-n-max", None),
}


def speculative_options(config: TrialConfig, ctx: LaunchContext) -> list[tuple[str, str]]:
    """``--spec-type`` is always explicit: in this llama.cpp ``-md`` alone does not draft.

    A stack is one comma-separated ``--spec-type`` list; llama.cpp builds the lookup types before
    the draft models whatever the order, so on each step a lookup hit drafts and the draft model
    fills in where lookup has nothing."""
    if not config.speculative:
        return []
    options = [("--spec-type", ",".join(config.spec_types))]
    if config.spec_type == "draft-simple":
        if config.draft not in ctx.drafts:
            raise TrialFailure(FailureReason.INVALID_CONFIG, f"unknown draft {config.draft!r}")
        options += [
            ("--spec-draft-model", str(ctx.drafts[config.draft])),
            ("--spec-draft-threads", str(config.threads)),
            ("--spec-draft-threads-batch", str(config.threads_batch or config.threads)),
        ]
        if config.draft_p_min is not None:
            options.append(("--spec-draft-p-min", f"{config.draft_p_min:g}"))
    if config.spec_type in K_FLAGS and config.draft_max is not None:
        options.append((K_FLAGS[config.spec_type], str(config.draft_max)))
    if config.spec_type in MIN_FLAGS:
        # ngram-mod's own default minimum (48) exceeds small K, so it is always set.
        default_min = 0 if config.spec_type == "draft-simple" else 1
        n_min = config.draft_min if config.draft_min is not None else default_min
        if config.spec_type == "ngram-mod" or config.draft_min is not None:
            options.append((MIN_FLAGS[config.spec_type], str(min(n_min, config.draft_max or n_min))))
    return options + ngram_options(config)


def ngram_options(config: TrialConfig) -> list[tuple[str, str]]:
    """The sizes of the n-gram lookup in play; a size left out keeps llama.cpp's default."""
    if config.ngram_type not in NGRAM_FLAGS:
        return []
    key_flag, length_flag, hits_flag = NGRAM_FLAGS[config.ngram_type]
    options = []
    if config.ngram_key is not None:
        options.append((key_flag, str(config.ngram_key)))
    if hits_flag and config.ngram_min_hits is not None:
        options.append((hits_flag, str(config.ngram_min_hits)))
    if config.stacked and config.lookup_max is not None:
        options.append((length_flag, str(config.lookup_max)))
    if config.stacked and config.lookup == "ngram-mod":
        # as alone: ngram-mod's default minimum (48) exceeds any small draft length
        n_min = config.lookup_min if config.lookup_min is not None else 1
        options.append(("--spec-ngram-mod-n-min", str(min(n_min, config.lookup_max or n_min))))
    return options
