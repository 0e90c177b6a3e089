# Shared by the recipes (source it after setting RUN and PY): timed stages and curriculum-mix stages.

stage() {  # stage NAME COMMAND...: run, timing it into $RUN/stages.jsonl
  local name=$1; shift
  local t0=$(date +%s)
  echo "=== [$(date +%T)] stage $name: $*"
  "$@"
  local t1=$(date +%s)
  echo "{\"stage\": \"$name\", \"seconds\": $((t1 - t0)), \"finished\": \"$(date -Is)\"}" >> "$RUN/stages.jsonl"
  echo "=== [$(date +%T)] stage $name done in $((t1 - t0)) s"
}

mix_stage() {  # mix_stage NAME CONFIG DATA MIX_JSON: write the stage's mix (once), then train it
  local name=$1 config=$2 data=$3 mix=$4
  [ -f "$data" ] || stage "data-$name" $PY -m wedlm.data.curriculum --out "$data" --mix "$mix"
  stage "$name" $PY -m wedlm.cli.main train --config "$config"
}
