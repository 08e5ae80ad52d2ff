#!/bin/sh
# deploy/runpod/start.sh - the container command of a RunPod serverless endpoint running wick.
# RunPod starts the container with its job API in the environment; wick's http(s):// queue
# driver (worker/queue_http.c) speaks that API, so no Python handler is involved:
#
#   RUNPOD_WEBHOOK_GET_JOB      -> --queue (the job-take URL; "$ID" stays literal, wick fills it)
#   RUNPOD_WEBHOOK_POST_OUTPUT  -> read by wick: job-done URL (or --done-url)
#   RUNPOD_WEBHOOK_PING         -> read by wick: heartbeat URL listing held jobs (or --ping-url)
#   RUNPOD_PING_INTERVAL        -> read by wick: heartbeat period, ms (default 10000)
#   RUNPOD_POD_ID               -> read by wick: the worker id in the URLs
#   RUNPOD_AI_API_KEY           -> read by wick: sent as the Authorization header
#   RUNPOD_WEBHOOK_POST_STREAM  -> read by wick: where jobs with "stream": true post their text
#                                  as it is made (or --stream-url)
#
# Settings of this script (endpoint environment variables; wick does not read them):
#   WICK_SNAPSHOT      the snapshot on the network volume (default /runpod-volume/snapshots/glm5-fp8)
#   WICK_IDLE_TIMEOUT  backstop idle exit, seconds (default 300; RunPod's own idle timeout
#                      should stop the worker first, see deploy/README.md)
#   WICK_CONCURRENCY   jobs batched at once (default 4; with WICK_MAX_SEQ, what wick plan says fits)
#   WICK_MAX_SEQ       positions a sequence's KV cache holds (default 32768)
#   WICK_KV_DTYPE      the KV cache's type (default auto: bf16 for GLM-5; fp8 holds about 1.8
#                      times the tokens, wick plan --kv-dtype fp8 says how many sequences)
#   WICK_SPECULATE     draft tokens a step (default 0: off; see wick worker --speculate: the
#                      jobs' predictions, then the model's MTP layer or prompt lookup)
#   WICK_DRAFTER       where drafts come from (default auto: the MTP layer where the model
#                      has one and the engine runs it; mtp; lookup)
#   WICK_SPECULATE_MAX_BATCH  no drafts in a step of more jobs than this (default 0: no
#                      limit; a big batch is bound by compute)
#   WICK_DRAFT_COST    a draft token's cost against a step's, for how many drafts pay
#                      (default auto: measured from the worker's own steps)
#   WICK_PREFIX_CACHE_DIR  where the prefix cache is written at exit and read at the next
#                      start (default: none; the workers of an endpoint share its file, each
#                      one out adding its entries to it; its read is part of the start)
#   WICK_PREFIX_CACHE_MAX  that file's size at most (e.g. 8GB; default: no bound): the
#                      read at the start takes its size over the volume's bandwidth
set -eu

: "${RUNPOD_WEBHOOK_GET_JOB:?is not set: this container runs as a RunPod serverless worker}"
: "${RUNPOD_WEBHOOK_POST_OUTPUT:?is not set: wick posts results there}"
snap=${WICK_SNAPSHOT:-/runpod-volume/snapshots/glm5-fp8}
# The ledger outlives the worker on the network volume when that is writable by this user.
ledgers=/runpod-volume/wick-ledgers
if ! mkdir -p "$ledgers" 2>/dev/null || [ ! -w "$ledgers" ]; then
	ledgers=/var/lib/wick
fi

# Warm the page cache from the network volume; pieces still cached from the last start of this
# worker (FlashBoot) are skipped.
# In the background, so that a SIGTERM (the shell is PID 1 and would ignore it) stops it.
wick prefetch --threads 32 "$snap" &
pf=$!
trap 'kill "$pf" 2>/dev/null; exit 143' TERM INT
wait "$pf"
trap - TERM INT

exec wick worker --model "$snap" --queue "$RUNPOD_WEBHOOK_GET_JOB" \
	--backend cuda --concurrency "${WICK_CONCURRENCY:-4}" --max-seq "${WICK_MAX_SEQ:-32768}" \
	--kv-dtype "${WICK_KV_DTYPE:-auto}" --speculate "${WICK_SPECULATE:-0}" \
	--drafter "${WICK_DRAFTER:-auto}" --speculate-max-batch "${WICK_SPECULATE_MAX_BATCH:-0}" \
	--draft-cost "${WICK_DRAFT_COST:-auto}" \
	${WICK_PREFIX_CACHE_DIR:+--prefix-cache-dir "$WICK_PREFIX_CACHE_DIR"} \
	${WICK_PREFIX_CACHE_MAX:+--prefix-cache-max "$WICK_PREFIX_CACHE_MAX"} \
	--step-timeout 20 --idle-timeout "${WICK_IDLE_TIMEOUT:-300}" \
	--drain-timeout 25 --startup-timeout 1800 \
	--ledger "$ledgers/${RUNPOD_POD_ID:-$(hostname)}.jsonl" \
	--price-per-gpu-second 0.00155 --gpus 8 --gpu-type H200 --log-format json
