"""Read list-operation test sets in ParallelBench's file layout as `listops` tasks.

Layout (what `wedlm eval --tasks listops --data DIR` reads): anywhere under DIR,
a folder with a `task_config.yaml` that maps each task name `folder/task` to
its `prompt` (a Python format string with `{context}`, `{word}`, `{index}`),
its `type` and its `metric`; beside it one JSONL file per task,
`folder/task.jsonl` relative to the folder's parent. Each line is one item:

* `input.context`: the list, as a JSON list in a string (used verbatim in the prompt);
* `input.word` / `input.index`: the item and position of insert / remove / replace tasks;
* `input.icl_examples` (optional): demonstrations, each with its own `input` and `answer`;
* `answer`: the result as a JSON list in a string, or for the random tasks an
  object with the original list under `input`, the new item under `word` and
  one valid result under `example`;
* `metadata.length`: the list length.

Only list tasks are read (types copy, reverse, sort, shuffle, insert, remove,
replace); folders of other task families are skipped with a note. Metrics map
to scorers of `wedlm.evaluate.listops`: exact match for the deterministic
operations, validity for shuffle and random insert / remove / replace.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import yaml

from .listops import list_reference, score_list_item
from .tasks import EvalItem, EvalTask

LIST_TYPES = ("copy", "reverse", "sort", "shuffle", "insert", "remove", "replace")
METRIC_KINDS = {"list_match_score": "exact", "list_shuffle_score": "shuffle",
                "list_random_insert_score": "insert", "list_random_remove_score": "remove",
                "list_random_replace_score": "replace"}
MAX_TOKENS = 256  # 15 two-word names as a quoted JSON list, with room to spare
RAW_STOP = ["\n\n"]


def _as_list(value, where: str) -> list[str]:
    """A JSON list given as a string (or already a list) -> list of strings."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as err:
            raise ValueError(f"{where}: not a JSON list: {value[:60]!r} ({err.msg})") from None
    if not isinstance(value, list):
        raise ValueError(f"{where}: expected a list, got {type(value).__name__}")
    return [str(x) for x in value]


def render_prompt(template: str, inp: dict, where: str) -> str:
    """`template` filled with the item's `context`, `word` and `index`.

    Raises:
        ValueError: `input.context` missing, or the template names a field the item lacks.
    """
    if "context" not in inp:
        raise ValueError(f"{where}: input.context is missing")
    context = inp["context"] if isinstance(inp["context"], str) else json.dumps(inp["context"])
    fields = {"context": context, **{k: inp[k] for k in ("word", "index") if inp.get(k) is not None}}
    try:
        return template.format(**fields)
    except KeyError as err:
        name = err.args[0]
        raise ValueError(f"{where}: the prompt uses {{{name}}} but the item has no input.{name}") from None


def answer_text(answer) -> str:
    """The answer as the model should write it (the `example` of a random task's answer object)."""
    return answer.get("example", "") if isinstance(answer, dict) else str(answer)


def item_reference(kind: str, inp: dict, answer, where: str) -> dict:
    """The scorer's reference of one record (its `input` object and `answer`) for score kind `kind`."""
    if answer is None:
        raise ValueError(f"{where}: answer is missing")
    if kind == "exact":
        return list_reference("exact", gold=_as_list(answer_text(answer), f"{where}: answer"))
    original = answer.get("input") if isinstance(answer, dict) else None
    original = _as_list(original if original is not None else inp.get("context"), f"{where}: original list")
    word = (answer.get("word") if isinstance(answer, dict) else None) or inp.get("word")
    return list_reference(kind, original=original, word=word)


def read_item(record: dict, template: str, kind: str, task: str, index: int) -> EvalItem:
    """One JSONL record as an `EvalItem` (chat turns with the demonstrations first, and raw text)."""
    where = f"{task} line {index + 1}"
    inp = record.get("input")
    if isinstance(inp, str):  # some exports store the input object as a JSON string
        inp = json.loads(inp)
    if not isinstance(inp, dict):
        raise ValueError(f"{where}: input must be an object")
    messages, raw = [], []
    for k, demo in enumerate(inp.get("icl_examples") or []):
        shot = render_prompt(template, demo.get("input") or {}, f"{where} icl_examples[{k}]")
        reply = answer_text(demo.get("answer", ""))
        messages += [{"role": "user", "content": shot}, {"role": "assistant", "content": reply}]
        raw.append(f"{shot}\n{reply}\n\n")
    prompt = render_prompt(template, inp, where)
    messages.append({"role": "user", "content": prompt})
    return EvalItem(id=f"listops/{task}/{index}", messages=messages, raw="".join(raw) + prompt + "\n",
                    reference=item_reference(kind, inp, record.get("answer"), where))


def task_kind(task: str, config: dict, source: Path) -> str:
    """The score kind of a task from its `metric`.

    Raises:
        ValueError: a missing or unknown metric, naming the task and the file.
    """
    metric = config.get("metric")
    if metric not in METRIC_KINDS:
        raise ValueError(f"{source}: task {task!r} has metric {metric!r}; list metrics are {sorted(METRIC_KINDS)}")
    return METRIC_KINDS[metric]


def read_task(data_file: Path, task: str, config: dict, source: Path, limit: int | None,
              max_tokens: int | None) -> EvalTask:
    """The `EvalTask` `listops/<task>` of one JSONL file."""
    if not isinstance(config.get("prompt"), str):
        raise ValueError(f"{source}: task {task!r} has no prompt template")
    kind = task_kind(task, config, source)
    items = []
    with data_file.open(encoding="utf-8") as f:
        for i, line in enumerate(f):
            if limit is not None and len(items) >= limit:
                break
            if line.strip():
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as err:
                    raise ValueError(f"{data_file} line {i + 1}: not JSON ({err.msg})") from None
                items.append(read_item(record, config["prompt"], kind, task, i))
    return EvalTask(name=f"listops/{task}", items=items, score=score_list_item,
                    max_tokens=max_tokens or MAX_TOKENS, raw_stop=list(RAW_STOP), kind="low-entropy")


def parallelbench_tasks(root: str | Path, limit: int | None = None, max_tokens: int | None = None) -> list[EvalTask]:
    """Every list task under `root`, in sorted order of task name.

    Args:
        root: a folder holding task_config.yaml files (at any depth) and their JSONL files.
        limit: items per task (None = all).
        max_tokens: generation budget per item (default 256).

    Raises:
        FileNotFoundError: `root` is not a folder or holds no list task with its data file.
        ValueError: a malformed config or record, naming the file, task and line.
    """
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"--data {root}: not a folder")
    tasks, skipped = [], []
    for source in sorted(root.rglob("task_config.yaml")):
        configs = yaml.safe_load(source.read_text(encoding="utf-8")) or {}
        if not isinstance(configs, dict):
            raise ValueError(f"{source}: expected a mapping of task name -> config")
        for task, config in sorted(configs.items()):
            if not isinstance(config, dict) or config.get("type") not in LIST_TYPES:
                skipped.append(f"{task} (type {config.get('type') if isinstance(config, dict) else None})")
                continue
            data_file = source.parent.parent / f"{task}.jsonl"
            if not data_file.is_file():
                data_file = source.parent / f"{task.rsplit('/', 1)[-1]}.jsonl"
            if not data_file.is_file():
                skipped.append(f"{task} (no {data_file.name})")
                continue
            tasks.append(read_task(data_file, task, config, source, limit, max_tokens))
    if skipped:
        print(f"listops: skipped {len(skipped)} non-list or missing tasks: {', '.join(skipped)}", file=sys.stderr)
    if not tasks:
        raise FileNotFoundError(f"--data {root}: no list task (task_config.yaml with types {LIST_TYPES} "
                                "and its folder/task.jsonl) found")
    return tasks
