"""Command-line options shared by the `wedlm` sub-commands, defined once.

Every command spells the knobs the same way: the engine options (`--model`,
`--wedlm-window-size` W, `--max-model-len`, `--device`, `--dtype`, ...), the sampling
options (`--decoding`, `--wedlm-entropy-threshold` tau, `--wedlm-pos-penalty-factor`
lambda, `--temperature`, ...; docs/method.md, "Streaming parallel decoding"; the WeDLM
flags carry the library's field names, with the short aliases `--window-size`,
`--threshold`, `--penalty`, `--stop-by-ar` and `--stop-in-run`) and the runtime options of
the measuring commands (`--threads`). Unset options keep the library's defaults
(`wedlm/engine/defaults.py`). Also the helpers that turn them into an `LLM` and
`SamplingParams`, the chat prompt, the one-line stats summary and the notes on stderr
(truncation, Ctrl-C), and `UsageError`: a user mistake that `wedlm` reports on stderr
with exit status 2 instead of a traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import signal
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from ..engine.defaults import DECODERS, DEFAULT_ENTROPY_THRESHOLD, DEFAULT_POS_PENALTY, QUANTIZATIONS, check_knob

DEFAULT_MODEL = Path(__file__).resolve().parents[2] / "models" / "wedlm-tiny"
# Answer budget of generate and chat when neither --max-tokens nor the model folder's
# generation_config.json (max_new_tokens) sets one: the shipped model's longest answers
# ("Count from 1 to 200." is 891 tokens) fit.
DEFAULT_MAX_TOKENS = 1024


class UsageError(Exception):
    """A user mistake (bad option, missing file, unavailable device): `wedlm` prints
    `wedlm COMMAND: error: MESSAGE` on stderr and exits with status 2, no traceback."""


def default_model() -> str:
    """The shipped tiny WeDLM model (models/wedlm-tiny in the repository)."""
    return str(DEFAULT_MODEL)


def int_at_least(low: int) -> Callable[[str], int]:
    """An argparse type: an integer >= `low` (argparse reports anything else with exit status 2)."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be >= {low}, got {value}")
        return value

    parse.__name__ = f"integer >= {low}"
    return parse


def int_between(low: int, high: int) -> Callable[[str], int]:
    """An argparse type: an integer in [`low`, `high`] (argparse reports anything else with exit status 2)."""
    at_least = int_at_least(low)

    def parse(text: str) -> int:
        value = at_least(text)
        if value > high:
            raise argparse.ArgumentTypeError(f"must be <= {high}, got {value}")
        return value

    parse.__name__ = f"integer in [{low}, {high}]"
    return parse


def non_negative_float(text: str) -> float:
    """An argparse type: a finite number >= 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be >= 0 and finite, got {text}")
    return value


def check_model(path: str) -> None:
    """Fail early, before a long run starts, when `path` is not a loadable checkpoint folder
    (the loader's own checks on config and weights, on the meta device: no memory) or its
    generation_config.json holds a value the engine would refuse when it starts.

    Raises:
        UsageError: the loader's or the defaults' message.
    """
    from wedlm.engine.defaults import model_decoding_defaults, model_prompt_defaults
    from wedlm.model.loader import CheckpointError, meta_model

    try:
        meta_model(path)
        if Path(path).is_dir():  # a .gguf file or hub id has no folder of its own to read yet
            model_decoding_defaults(path)
            model_prompt_defaults(path)
    except (OSError, ValueError, CheckpointError) as err:
        raise UsageError(str(err)) from None


def add_device_args(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """--device and --dtype, the same for every command."""
    parser.add_argument("--device", default="cpu", help="torch device, e.g. cpu or cuda (default: %(default)s)")
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"),
                        help="weights and activations dtype (default: %(default)s)")
    parser.add_argument("--quantization", default=None, choices=QUANTIZATIONS,
                        help="int8: every matmul in int8 (weights per output channel, activations per row); "
                             "bf16: every matmul on bf16 weights with float32 activations (a CPU with "
                             "AVX512-BF16); both CPU, float32 checkpoints; default: none")


def add_runtime_args(parser: argparse.ArgumentParser) -> None:
    """--device, --dtype and --threads, shared by the measuring commands (bench, eval)."""
    add_device_args(parser)
    parser.add_argument("--threads", type=int_at_least(1), default=None,
                        help="torch CPU threads (default: torch's; 1 is fastest on a busy machine)")


def apply_threads(args: argparse.Namespace) -> None:
    """Set torch's CPU thread count from --threads when given."""
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)


def add_engine_args(parser: argparse.ArgumentParser, one_answer: bool = False) -> None:
    """Options that build the `LLM` (model folder, device, limits, window)."""
    group = parser.add_argument_group("engine")
    group.add_argument("--model", default=default_model(),
                       help="model folder (HF config.json + safetensors + tokenizer), .gguf file or hub id "
                            "org/name; default: the shipped %(default)s")
    add_revision_arg(group)
    group.add_argument("--wedlm-window-size", "--window-size", dest="window_size", type=int, default=None,
                       metavar="W",
                       help="WeDLM decoding window W (slots decoded in parallel); default: the model's "
                            "generation_config.json, else 16")
    group.add_argument("--max-model-len", type=int, default=None, metavar="N",
                       help="context length (prompt + generated tokens); default: the model's")
    group.add_argument("--max-num-seqs", type=int, default=None, metavar="N",
                       help="most requests in one continuous batch; default: the engine's")
    group.add_argument("--kv-block-size", type=int, default=None, metavar="N",
                       help="tokens per paged KV-cache block; default: the engine's")
    add_device_args(group)
    group.add_argument("--tensor-parallel-size", type=int, default=None, metavar="N",
                       help="split the weights across N ranks (N GPUs from --device's index, or N CPU "
                            "processes); default: 1")
    add_speed_args(group, one_answer)


def add_revision_arg(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """--revision: the branch, tag or commit of a hub id given as --model."""
    parser.add_argument("--revision", default=None,
                        help="hub revision (branch, tag or commit) when --model is a hub id; default: main")


def resolve_model_arg(args: argparse.Namespace) -> bool:
    """Turn `args.model` (a folder, a .gguf file or a hub id at `args.revision`) into its checkpoint
    folder before the command runs (`wedlm.model.source.resolve_model`), so every command reads a
    folder. A served model keeps the name given. False after printing `wedlm COMMAND: error: ...`."""
    model = getattr(args, "model", None)
    if not isinstance(model, str) or getattr(args, "command", None) == "lm-eval":
        return True
    from wedlm.model.source import resolve_model

    try:
        folder = resolve_model(model, getattr(args, "revision", None))
    except OSError as err:
        print(f"wedlm {args.command}: error: {err}", file=sys.stderr)
        return False
    if hasattr(args, "served_model_name") and args.served_model_name is None:
        args.served_model_name = Path(model).name
    args.model, args.revision = str(folder), None  # resolved: the folder is the model now
    return True


def add_speed_args(parser: argparse.ArgumentParser | argparse._ArgumentGroup, one_answer: bool = False) -> None:
    """--enforce-eager / --no-enforce-eager and --autocast / --no-autocast (engine options).

    `one_answer` (generate, chat): eager by default, because one answer does not repay the
    compile a fresh process pays first (27-52 s with a cold compile cache, 4-9 s warm, against
    about 0.15 s eager on the shipped model; docs/engine.md, "Compiled forward")."""
    default = ("eager (one answer does not repay a fresh process's compile)" if one_answer else
               "automatic, compiled wherever torch's inductor can build kernels (a C++ compiler on a CPU, Triton "
               "on CUDA)")
    parser.add_argument("--enforce-eager", action=argparse.BooleanOptionalAction, default=True if one_answer else None,
                        help="--enforce-eager runs the forward eagerly (the reference path); "
                             "--no-enforce-eager forces the torch.compile'd forward on shape buckets (CUDA: plus "
                             f"CUDA graphs of decode steps), its graphs cached on disk ($TORCHINDUCTOR_CACHE_DIR, "
                             f"else ~/.cache/wedlm/torch-compile); default: {default}")
    parser.add_argument("--autocast", action=argparse.BooleanOptionalAction, default=None,
                        help="bf16 autocast of float32 weights; default: automatic (bf16 for a CPU with native "
                             "bf16 matrix units, AMX / AVX512-BF16, and a model of hidden size >= 512: bf16 "
                             "weights with float32 activations where the engine's bf16 kernel runs, else autocast)")


def add_sampling_args(parser: argparse.ArgumentParser) -> None:
    """Options that build the `SamplingParams` of each request."""
    group = parser.add_argument_group("sampling and decoding")
    group.add_argument("--decoding", choices=DECODERS, default=None,
                       help="decoding strategy: wedlm (streaming parallel; the default for a model with a [MASK] token), "
                            "ar (one token per forward; the default for a plain AR model), "
                            "blockwise (stop-and-wait blocks), verified (lossless, equals ar when greedy)")
    group.add_argument("--wedlm-entropy-threshold", "--threshold", dest="threshold", type=float, default=None,
                       metavar="TAU",
                       help="entropy threshold tau: masks with distance-adjusted entropy below it are filled each "
                            "step (higher = more tokens per forward); "
                            f"default: the model's or {DEFAULT_ENTROPY_THRESHOLD}")
    group.add_argument("--wedlm-pos-penalty-factor", "--penalty", dest="penalty", type=float, default=None,
                       metavar="LAMBDA",
                       help="position penalty lambda added per slot of distance from the leftmost mask; "
                            f"default: the model's or {DEFAULT_POS_PENALTY}")
    group.add_argument("--wedlm-stop-by-ar", "--stop-by-ar", dest="stop_by_ar",
                       action=argparse.BooleanOptionalAction, default=None,
                       help="wedlm decoding: fill the leftmost mask from the AR head each step and let only it "
                            "end the answer; default: the model's generation_config.json, else off")
    group.add_argument("--wedlm-stop-in-run", "--stop-in-run", dest="stop_in_run",
                       action=argparse.BooleanOptionalAction, default=None,
                       help="with --stop-by-ar: a mask may also end the answer when every mask to its left is "
                            "filled in the same forward; default: the model's generation_config.json, else off")
    group.add_argument("--temperature", type=float, default=None,
                       help="0 = greedy; default: the library's (0.2)")
    group.add_argument("--top-p", type=float, default=None, help="nucleus sampling mass in [0, 1] (0 = only the most likely token)")
    group.add_argument("--top-k", type=int, default=None, help="sample among the k most likely tokens (0 = off)")
    group.add_argument("--max-tokens", type=int, default=None,
                       help="most tokens to generate; an answer cut there ends with [stopped: max tokens N] on "
                            "stderr; default: the model's generation_config.json (max_new_tokens), "
                            f"else {DEFAULT_MAX_TOKENS}")
    group.add_argument("--stop", action="append", default=None, metavar="TEXT",
                       help="stop string (repeatable); the text ends before it")
    group.add_argument("--seed", type=int, default=None, help="per-request sampling seed")
    group.add_argument("--ignore-eos", action="store_true", help="keep generating past the model's stop tokens")
    group.add_argument("--stop-token-id", dest="stop_token_ids", type=int, action="append", default=None,
                       metavar="ID", help="extra stop token id (repeatable), on top of the model's")
    group.add_argument("--logit-bias", default=None, metavar="ID:BIAS,...",
                       help="add BIAS in [-100, 100] to token ID's logit (-100 bans it, 100 forces it), e.g. 21:-100,7:2.5")
    group.add_argument("--repetition-penalty", type=float, default=None, metavar="R",
                       help="> 0, 1 = off: divide positive / multiply negative logits of tokens in the prompt "
                            "or generated so far")
    group.add_argument("--presence-penalty", type=float, default=None, metavar="P",
                       help="in [-2, 2]: subtract P from the logit of every token generated so far")
    group.add_argument("--frequency-penalty", type=float, default=None, metavar="F",
                       help="in [-2, 2]: subtract F times its count from each generated token's logit")
    group.add_argument("--min-p", type=float, default=None, help="in [0, 1]: sampling drops tokens less likely "
                                                                 "than min-p times the most likely one")
    group.add_argument("--min-tokens", type=int, default=None, metavar="N",
                       help="the stop tokens cannot end the answer before N tokens")


def parse_logit_bias(text: str | None) -> dict[str, float] | None:
    """`--logit-bias "ID:BIAS,..."` as {ID: BIAS} (ranges are checked by `SamplingParams`).

    Raises:
        ValueError: naming the option, for text that is not comma-separated ID:BIAS pairs.
    """
    if text is None:
        return None
    out: dict[str, float] = {}
    for pair in filter(None, (p.strip() for p in text.split(","))):
        key, sep, value = pair.partition(":")
        try:
            out[key.strip()] = float(value)
        except ValueError:
            sep = ""
        if not sep:
            raise ValueError(f"--logit-bias must be ID:BIAS pairs separated by commas (e.g. 21:-100), got {pair!r}")
    return out


# argparse dest -> the WeDLM knob it sets (single values, or the sweep lists of `wedlm bench`)
KNOB_OPTIONS = {"window_size": "wedlm_window_size", "threshold": "wedlm_entropy_threshold",
                "penalty": "wedlm_pos_penalty_factor", "taus": "wedlm_entropy_threshold",
                "blockwise_taus": "wedlm_entropy_threshold", "lambda_tau": "wedlm_entropy_threshold",
                "lambdas": "wedlm_pos_penalty_factor"}


def bad_knob_option(args: argparse.Namespace, command: str) -> bool:
    """True after printing `wedlm COMMAND: error: ...` when a WeDLM knob option is out of range
    (the library's own check, `check_knob`, so the message is the library's)."""
    for dest, knob in KNOB_OPTIONS.items():
        value = getattr(args, dest, None)
        for v in value if isinstance(value, (tuple, list)) else [value]:
            try:
                if v is not None:
                    check_knob(knob, v)
            except ValueError as err:
                print(f"wedlm {command}: error: {err}", file=sys.stderr)
                return True
    return False


def build_llm(args: argparse.Namespace) -> Any:
    """`wedlm.LLM` from the engine options; unset ones keep the engine's defaults."""
    from wedlm import LLM

    return LLM(**llm_kwargs(args))


def llm_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """The `wedlm.LLM` keyword arguments of the engine options (unset ones left out)."""
    kwargs: dict[str, Any] = {"model": args.model, "device": args.device, "dtype": args.dtype,
                              "revision": getattr(args, "revision", None)}
    optional = {"wedlm_window_size": args.window_size, "max_model_len": args.max_model_len,
                "max_num_seqs": args.max_num_seqs, "kv_block_size": args.kv_block_size,
                "tensor_parallel_size": args.tensor_parallel_size, "enforce_eager": args.enforce_eager,
                "autocast": args.autocast, "quantization": args.quantization}
    kwargs.update({k: v for k, v in optional.items() if v is not None})
    return kwargs


def load_llm(args: argparse.Namespace, command: str) -> Any | None:
    """`build_llm`, or None after printing `wedlm COMMAND: error: ...` for a missing or bad
    model folder, an unavailable device or a bad engine option (no traceback)."""
    from wedlm.model.loader import CheckpointError

    _show_one_off_builds()
    try:
        return build_llm(args)
    except (OSError, ValueError, CheckpointError) as err:
        print(f"wedlm {command}: error: {err}", file=sys.stderr)
        return None


def _show_one_off_builds() -> None:
    """Print the engine's one-off build of its C++ operators (10-25 s, once per machine and torch
    version) on stderr, so that a first command does not sit silent through it. Commands that
    configure logging (`serve`) show it through their own handlers."""
    native = logging.getLogger("wedlm.engine.native")
    if not native.handlers and not logging.getLogger().handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("wedlm: %(message)s"))
        native.addHandler(handler)
        native.setLevel(logging.INFO)


def check_output(path: str | Path, flag: str, folder: bool = False) -> None:
    """Fail early, before a long run, when its results could not be written to `path` (a file,
    or with `folder` a folder that is made): the path is the other kind, a file stands where
    one of its parent folders would go, or the folder cannot be made or written to. The folder
    (with `folder`, else the file's) is made now, and a scratch file created and removed in it.

    Raises:
        UsageError: naming `flag`, the path and what is in the way.
    """
    path = Path(path)
    if path.exists() and path.is_dir() != folder:
        raise UsageError(f"{flag} {path}: is {'a file' if folder else 'a folder'}; expected "
                         f"{'a folder' if folder else 'a file name'}")
    blocker = next((p for p in path.parents if p.exists() and not p.is_dir()), None)
    if blocker is not None:
        raise UsageError(f"{flag} {path}: {blocker} is a file, so no folder can be made there")
    where = path if folder else path.parent
    try:
        where.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=where):
            pass
    except OSError as err:
        raise UsageError(f"{flag} {path}: cannot write there ({err.strerror or err})") from None


def check_engine_options(args: argparse.Namespace) -> None:
    """Fail early, before a long run builds its first engine, on engine options that cannot go
    together: `EngineConfig`'s checks and the quantization's device and dtype, the engine's own.

    Raises:
        UsageError: naming the options and what they allow.
    """
    from wedlm.engine.config import EngineConfig, resolve_device, resolve_dtype
    from wedlm.engine.quantize import check_quantization

    try:
        config = EngineConfig(model=str(args.model), device=args.device, dtype=args.dtype,
                              tensor_parallel_size=getattr(args, "tensor_parallel_size", None) or 1,
                              enforce_eager=args.enforce_eager, autocast=args.autocast, quantization=args.quantization)
        device = resolve_device(config.device)
        check_quantization(config.quantization, device, resolve_dtype(config.dtype, device))
    except ValueError as err:
        raise UsageError(str(err)) from None


def check_device(device: str) -> None:
    """Fail early, before any model loads, on a device this machine does not have.

    Raises:
        UsageError: naming the device and the available ones.
    """
    from wedlm.engine.config import resolve_device

    try:
        resolve_device(device)
    except ValueError as err:
        raise UsageError(str(err)) from None


def prompt_defaults(model: str) -> dict:
    """The model folder's prompting keys (`wedlm.engine.defaults.model_prompt_defaults`).

    Raises:
        UsageError: a bad value in its generation_config.json (the message names file and key).
    """
    from wedlm.engine.defaults import model_prompt_defaults

    try:
        return model_prompt_defaults(model)
    except (ValueError, OSError) as err:
        raise UsageError(str(err)) from None


def default_max_tokens(args: argparse.Namespace) -> int:
    """--max-tokens, else the model's max_new_tokens, else `DEFAULT_MAX_TOKENS`."""
    if args.max_tokens is not None:
        return args.max_tokens
    return prompt_defaults(args.model)["max_new_tokens"] or DEFAULT_MAX_TOKENS


def sampling_params_from_args(args: argparse.Namespace) -> Any:
    """`wedlm.SamplingParams` from the sampling options (ValueError names a bad field)."""
    from wedlm import SamplingParams

    fields = {"decoding": args.decoding, "wedlm_entropy_threshold": args.threshold,
              "wedlm_pos_penalty_factor": args.penalty, "temperature": args.temperature,
              "top_p": args.top_p, "top_k": args.top_k, "max_tokens": default_max_tokens(args),
              "stop": args.stop, "seed": args.seed, "wedlm_stop_by_ar": args.stop_by_ar,
              "wedlm_stop_in_run": args.stop_in_run, "stop_token_ids": args.stop_token_ids,
              "logit_bias": parse_logit_bias(args.logit_bias), "repetition_penalty": args.repetition_penalty,
              "presence_penalty": args.presence_penalty, "frequency_penalty": args.frequency_penalty,
              "min_p": args.min_p, "min_tokens": args.min_tokens, "logprobs": getattr(args, "logprobs", None)}
    kwargs = {k: v for k, v in fields.items() if v is not None}
    if args.ignore_eos:
        kwargs["ignore_eos"] = True
    return SamplingParams(**kwargs)


def chat_prompt(tokenizer: Any, messages: list[dict[str, str]]) -> list[int]:
    """Token ids of the chat template applied to `messages`, ending with the assistant's turn
    header; message text never becomes control tokens (`wedlm.engine.chat.encode_chat`).

    Raises:
        ValueError: the model folder has no tokenizer or no chat template, or the template
            cannot render a message.
    """
    from wedlm.engine.chat import encode_chat

    if tokenizer is None or not getattr(tokenizer, "chat_template", None):
        raise ValueError("the model folder has no tokenizer chat template; drop --chat or add one")
    return encode_chat(tokenizer, messages)


def fit_budget(llm: Any, prompt_ids: list[int], params: Any, explicit: bool) -> Any:
    """`params`, or a copy whose max_tokens is what is left of the context after the prompt
    when the budget was not given on the command line (`explicit` False) and does not fit;
    an explicit budget that does not fit stays, and the engine names it."""
    import dataclasses

    room = llm.max_model_len - len(prompt_ids)
    if explicit or room < 1 or params.max_tokens <= room:
        return params
    return dataclasses.replace(params, max_tokens=room)


def stop_note(finish_reason: str | None, max_tokens: int) -> str | None:
    """The note printed on stderr when an answer was cut at the token budget, else None."""
    if finish_reason == "length":
        return f"[stopped: max tokens {max_tokens}]"
    return None


@contextlib.contextmanager
def deferred_interrupt() -> Iterator[Callable[[], bool]]:
    """Turn Ctrl-C into a flag while the body runs, so a streamed answer ends between two
    engine steps (the request is then aborted and its KV blocks freed) instead of in the
    middle of one. Yields `interrupted()`; a second Ctrl-C raises KeyboardInterrupt as usual
    (an engine step that never returns can still be left). Off the main thread, where
    Python delivers no signals, it only yields a function that returns False.
    """
    if threading.current_thread() is not threading.main_thread():
        yield lambda: False
        return
    hits = []

    def handler(signum, frame):
        hits.append(signum)
        if len(hits) > 1:
            raise KeyboardInterrupt

    previous = signal.signal(signal.SIGINT, handler)
    try:
        yield lambda: bool(hits)
    finally:
        signal.signal(signal.SIGINT, previous)


def format_stats(stats: dict | None, seconds: float | None = None) -> str:
    """One line: tokens, forwards, tokens/forward, p_cache and tok/s of a finished request."""
    stats = stats or {}
    tokens = stats.get("decode_tokens", 0)
    line = (f"{tokens} tokens · {stats.get('decode_forwards', 0)} forwards · "
            f"{stats.get('tokens_per_forward', 0.0):.2f} tokens/forward · p_cache {stats.get('p_cache', 0.0):.3f}")
    if seconds:
        line += f" · {tokens / seconds:.1f} tok/s"
    return line
