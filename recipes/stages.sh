# Steps shared by the recipes (source it after setting RUN and PY). Each step is skipped when its
# result exists, so an interrupted recipe resumes where it stopped (a training stage also resumes
# from its last checkpoint). With DRY_RUN=1 every step prints its name and command instead of
# running (one line each, tab-separated, newlines in arguments as spaces): the recipe's plan, which
# tests/test_recipes.py checks.

todo() {  # todo PATH: true when the step that makes PATH must run (always, in a dry run)
  [ "${DRY_RUN:-0}" = 1 ] || [ ! -e "$1" ]
}

stage() {  # stage NAME COMMAND...: run, timing it into $RUN/stages.jsonl
  local name=$1; shift
  if [ "${DRY_RUN:-0}" = 1 ]; then printf '%s\t' "$name" "${@//$'\n'/ }"; printf '\n'; return; fi
  local t0=$(date +%s)
  echo "=== [$(date +%T)] stage $name: $*"
  "$@"
  local t1=$(date +%s)
  echo "{\"stage\": \"$name\", \"seconds\": $((t1 - t0)), \"finished\": \"$(date -Is)\"}" >> "$RUN/stages.jsonl"
  echo "=== [$(date +%T)] stage $name done in $((t1 - t0)) s"
}

mix() {  # mix FILE JSON: write one curriculum mix (train split only, see wedlm/data/curriculum.py)
  todo "$1" && stage "data-$(basename "$1" .jsonl)" $PY -m wedlm.data.curriculum --out "$1" --mix "$2"
  return 0
}

train() {  # train CONFIG [KEY=VALUE ...]: one training stage, the config with `--set` overrides
  local config=$1; shift
  local sets=() kv out
  out=$(sed -n 's/^out_dir: *//p' "$config")
  for kv in "$@"; do sets+=(--set "$kv"); [ "${kv%%=*}" = out_dir ] && out=${kv#*=}; done
  stage "$(basename "$out")" $PY -m wedlm.cli.main train --config "$config" "${sets[@]}"
}

convert() {  # convert SRC DST: an AR checkpoint plus the [MASK] token
  todo "$2/config.json" && stage convert $PY -m wedlm.cli.main convert "$1" "$2"
  return 0
}

grow() {  # grow SRC DST: twice the layers, same logits (python -m wedlm.train.grow)
  todo "$2/model.safetensors" && stage grow $PY -m wedlm.train.grow "$1" "$2"
  return 0
}

export_model() {  # export_model SRC DST: config.json, model.safetensors and default decoding settings
  stage export $PY -m wedlm.train.export "$1" "$2"
}
