# Sourced by the benchmark scripts: a redis-server of their own, pinned to one CPU, that
# keeps nothing on disk and is stopped by pid.
#
#   source scripts/own-redis.sh
#   own_redis_start PORT CPU DIR     # sets own_redis_pid; returns once it answers PING
#   own_redis_stop                   # in the script's EXIT trap

own_redis_start() { # port cpu dir
  taskset -c "$2" redis-server --port "$1" --bind 127.0.0.1 --save "" \
    --appendonly no --dir "$3" --logfile "$3/redis.log" &
  own_redis_pid=$!
  for _ in $(seq 1 50); do
    redis-cli -p "$1" ping >/dev/null 2>&1 && return 0
    sleep 0.1
  done
  redis-cli -p "$1" ping >/dev/null
}

own_redis_stop() {
  if [ -n "${own_redis_pid:-}" ]; then
    kill "$own_redis_pid" 2>/dev/null || true
    wait "$own_redis_pid" 2>/dev/null || true
  fi
}
