#!/bin/sh
# shardsim container entrypoint: the first argument names the role.
#
#   configsvr [ARGS...]     python -m shardsim.configsvr --host 0.0.0.0 --port 27017 ARGS...
#   shard [ARGS...]         python -m shardsim.shard     --host 0.0.0.0 --port 27017 ARGS...
#   router [ARGS...]        python -m shardsim.router    --host 0.0.0.0 --port 27017 ARGS...
#   init [ARGS...]          add the shards to the cluster through the router (one-shot)
#   spark-master [ARGS...]  a Spark standalone master (pyspark's bundled Spark; Spark image only)
#   spark-worker [ARGS...]  a Spark standalone worker
#   shardsim [ARGS...]      the shardsim command line (e.g. `shardsim load ...`)
#   anything else           run as given
#
# Roles listen on 0.0.0.0 inside the container (reachable on the compose network only; the
# compose file publishes the router on the host's loopback). exec keeps the role as PID 1 so
# `docker stop` delivers SIGTERM to it (the roles stop cleanly on SIGTERM).
set -eu
PORT="${SHARDSIM_LISTEN_PORT:-27017}"
role="${1:-router}"
[ $# -gt 0 ] && shift

spark_home() {
    python -c 'import os, pyspark; print(os.path.dirname(pyspark.__file__))'
}

case "$role" in
    configsvr|shard|router)
        exec python -m "shardsim.$role" --host 0.0.0.0 --port "$PORT" "$@" ;;
    init)
        exec python /usr/local/lib/shardsim/init_cluster.py "$@" ;;
    spark-master)
        SPARK_HOME="$(spark_home)"; export SPARK_HOME
        exec "$SPARK_HOME/bin/spark-class" org.apache.spark.deploy.master.Master "$@" ;;
    spark-worker)
        SPARK_HOME="$(spark_home)"; export SPARK_HOME
        exec "$SPARK_HOME/bin/spark-class" org.apache.spark.deploy.worker.Worker "$@" ;;
    shardsim)
        exec shardsim "$@" ;;
    *)
        exec "$role" "$@" ;;
esac
