# Shell helpers the load test's scripts share (sourced, from the repository's root).

# Waits up to 20 s for a listener on 127.0.0.1:$1; fails (non-zero) when none comes.
wait_port() {
    for _ in $(seq 1 200); do
        (echo >"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0
        sleep 0.1
    done
    echo "nothing listens on port $1" >&2
    return 1
}

# The single-worker ringway config the measuring scripts (instructions.sh, footprint.sh) run:
# one listener on 127.0.0.1:$1, every path proxied to the origin on 127.0.0.1:$2. Printed.
ringway_config() {
    cat <<TOML
workers = 1
log_level = "warn"

[[listeners]]
address = "127.0.0.1:$1"

[[upstreams]]
name = "origin"
endpoints = ["127.0.0.1:$2"]
pool_max_idle = 1024

[[routes]]
path_prefix = "/"
proxy = "origin"
TOML
}
