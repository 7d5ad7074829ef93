#!/bin/sh
# Every MGN_* variable the library or the mgn tool reads (getenv, env_str, env_flag, env) has its entry in
# docs/environment.md. Usage: env_documented.sh SOURCE_DIR
root=${1:?usage: env_documented.sh SOURCE_DIR}
vars=$(grep -rhoE '(getenv|env_str|env_flag|env)\("MGN_[A-Z0-9_]+"' "$root/src" "$root/tools" |
  grep -oE 'MGN_[A-Z0-9_]+' | sort -u)
[ -n "$vars" ] || { echo "env_documented.sh: no MGN_ variable found under $root/src, $root/tools"; exit 1; }
missing=""
for v in $vars; do
  grep -q "\`$v\`" "$root/docs/environment.md" || missing="$missing $v"
done
if [ -n "$missing" ]; then
  echo "read by the code but not in docs/environment.md:$missing"
  exit 1
fi
echo "$(echo "$vars" | wc -l) variables, all in docs/environment.md"
