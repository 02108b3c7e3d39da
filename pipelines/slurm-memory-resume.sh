#!/bin/bash
# slurm-memory-resume.sh — a requeueing finetune on 2 nodes under SLURM that comes back from
# a lost process or a lost node through the memory snapshots (docs/checkpoints.md, "Memory
# snapshots"), and from the disk checkpoint where memory cannot serve.
#
#   sbatch pipelines/slurm-memory-resume.sh MODEL.h5 DATA.h5 RUN_DIR [ftk-train options…]
#
# On several ranks ftk-train snapshots every step (--memory-snapshot-every 1 by default):
# each rank's shard of the state into its node's memory (--memory-dir, default
# $FTK_MEMORY_DIR, else /dev/shm) and a copy into a partner rank's on the other node. Every
# end of this script that is not "done" or "bad usage" requeues the job, and the relaunch's
# --resume auto takes, of the memory snapshots and the disk checkpoints, the newest step it
# can read whole:
#   - a rank killed, a node's processes gone (the node alive): every node's memory still
#     holds the step before the failure; at most one step is lost;
#   - a node lost and replaced: the survivor holds a copy of each of the lost node's
#     shards; the ranks on the new node receive them from it; at most one step is lost;
#   - both nodes lost, or memory emptied between allocations (see MEMORY below): the newest
#     disk checkpoint (--save-every / --save-every-minutes bound what that costs), and
#     ftk-train says why ("no complete memory snapshot …; resuming from disk").
# A snapshot that does not verify is not used either: ftk-train says so and reads the disk.
#
# PLACEMENT. A rank's partner is rank + (ranks per node), modulo the world: ranks must be
# placed in blocks of consecutive ranks per node (srun's --distribution=block, the default
# when tasks fill the nodes), and every node must run the same number of ranks, else there
# are no partner copies (a node's loss then falls back to disk). A requeued job must run on
# the same number of nodes and ranks: a snapshot of another world size is not used (a disk
# checkpoint is, resharded on load).
#
# MEMORY. The snapshots live in a tmpfs of each node, which survives the processes, not the
# node. It must also survive the job's end on a node that stays up: a requeue is a new
# allocation of the same job id, and sites whose epilog empties /dev/shm, or that give each
# job a private /dev/shm (job_container/tmpfs), lose the snapshots at every requeue. Such a
# site needs a node-local tmpfs kept across jobs: give it as FTK_MEMORY_DIR (or
# --memory-dir). Each node holds the two newest snapshots of its own shards and of its
# partner's (three while one is written): 4 to 6 × its share of the state (12 bytes per
# parameter in fp32 and bf16-mixed, 6 in bf16-true, ÷ the nodes; Llama-2-7B on 2 nodes:
# 81 GB per snapshot per node, 162-243 GB of tmpfs). A normal end removes them; a dead
# run's that are no newer than its disk checkpoint are removed at the next start on the
# node.
#
# EXIT STATUS of srun (the highest of its tasks'): 0 the run is done; 2 bad usage or input
# (nothing to gain from a restart: not requeued); 75 preempted (SIGUSR1 before the time
# limit or a preemption: every rank wrote the checkpoint) → requeue; anything else (1: a
# rank failed; a rank killed by a signal; srun's own errors when a node stops answering)
# → requeue. A node failure (NODE_FAIL) usually ends the batch script with the job: then
# SLURM itself requeues it (--requeue below, where the site's JobRequeue allows), excluding
# the failed node, and the next allocation runs this script again. MAX_RESTARTS (default
# 10) bounds the requeues, counted by SLURM_RESTART_COUNT, so that a failure that repeats
# (a full disk) ends the chain instead of looping.
#
# Not runnable here (no SLURM); pipelines/preempt-sim.sh runs the preemption part of this
# loop on one machine, and tests/bench/memsnap.sh the kill and the memory restart on
# simulated nodes (FTK_SIM_NODE_RANKS).
#
#SBATCH --job-name=ftk-memory-resume
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=8
#SBATCH --cpus-per-task=8
#SBATCH --time=04:00:00
#SBATCH --signal=USR1@120
#SBATCH --requeue
#SBATCH --open-mode=append
#SBATCH --output=ftk-memory-resume-%j.log
set -u
if [ $# -lt 3 ]; then
    echo "usage: sbatch slurm-memory-resume.sh MODEL.h5 DATA.h5 RUN_DIR [ftk-train options]" >&2
    exit 2
fi
model=$1 data=$2 run=$3
shift 3
max_restarts=${MAX_RESTARTS:-10}
restarts=${SLURM_RESTART_COUNT:-0}
export OMP_NUM_THREADS=${SLURM_CPUS_PER_TASK:-1}
echo "ftk-memory-resume: job ${SLURM_JOB_ID:-?} start $((restarts + 1)) on ${SLURM_JOB_NODELIST:-?}" \
    "(memory: ${FTK_MEMORY_DIR:-/dev/shm})" >&2

# --resume auto: memory snapshots where every shard is held by a node, else the newest disk
# checkpoint that verifies, else the start. --save-every-minutes keeps the disk copy recent
# for the case that memory cannot serve (both nodes lost).
srun --mpi=pmix --distribution=block ftk-train --model "$model" --data "$data" --out "$run" \
    --resume auto --save-every-minutes 30 "$@"
rc=$?

case $rc in
0)
    echo "ftk-memory-resume: done" >&2
    exit 0
    ;;
2)
    echo "ftk-memory-resume: ftk-train refused its arguments or inputs (exit 2); not requeued" >&2
    exit 2
    ;;
75) why="preempted with a checkpoint in $run" ;;
*) why="srun exited $rc (a rank or a node failed); the relaunch resumes from the nodes' memory where it holds every shard, else from disk" ;;
esac
if [ "$restarts" -ge "$max_restarts" ]; then
    echo "ftk-memory-resume: $why; $restarts restarts already (MAX_RESTARTS=$max_restarts): not requeued" >&2
    exit "$rc"
fi
echo "ftk-memory-resume: $why; requeueing job $SLURM_JOB_ID" >&2
scontrol requeue "$SLURM_JOB_ID"
exit "$rc"
