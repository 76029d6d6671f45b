# Sourced by the GPU scripts (gpu_benchmark.sh, gpu_lab.sh) from the checkout's root; LOG: where each
# candidate's probe goes.
# Prints the first candidate interpreter whose JAX backend is $1; says what each candidate has.
pick_python() {
  local py backend
  for py in ${PYTHON:-python3 /opt/torch/.venv/bin/python3 .venv/bin/python}; do
    backend=$(timeout 120 "$py" -c 'import jax; print(jax.__version__, jax.default_backend())' 2>>"$LOG" |
      tail -1)
    echo "$py: jax ${backend:-not importable}" | tee -a "$LOG" >&2
    if [[ "$backend" == *" $1" ]]; then echo "$py"; return 0; fi
  done
  return 1
}
