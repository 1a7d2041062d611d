// @airm/workload-runner: the rngd-pd workload runner, the launcher of local clusters (airm up,
// end-to-end tests, benches) and the airm CLI.
export { run, buildCommand, workerArgv, gatewayArgv, rngdPdWorkload, RunConfigSchema, type RunConfig, type ProcessCommand } from "./rngd-pd-workload.ts";
export { binPath, binFrom, pluginRegistry } from "./package-bins.ts";
export { StartAbortedError, startLocalCluster, sweepStaleClusterDirs, type ClusterOptions, type RunningCluster } from "./local-cluster.ts";
export { RESTART_POLICY, type RestartPolicy } from "./supervisor.ts";
export { planCluster, freePort, type ClusterShape, type ClusterPlan, type WorkerSpec } from "./cluster-plan.ts";
export { DEFAULT_BACKENDS, DEFAULT_KV_TRANSPORT, DEFAULT_PORTS, DEFAULT_THREADS, DEFAULT_REPLICAS, DEFAULT_DECODE_NICE } from "./defaults.ts";
export { ChildPart, type PartSpec } from "./child-part.ts";
export { chooseDefaultModel, type ChosenModel } from "./default-model.ts";
export { UP_COMMAND, startUpCluster, upCluster, type UpFlags } from "./up-command.ts";
export { NetnsRig, resolveTopology, type HostSpec, type RigHost, type RigOptions, type Topology } from "./netns-rig.ts";
export { NsBridge, MAX_BRIDGE_CONNECTIONS } from "./ns-bridge.ts";
export {
  checkTopology,
  placeCluster,
  planPlaced,
  readTopology,
  RIG_UCX_ENV,
  TopologyError,
  TransportAcrossHostsError,
  type Placement,
  type PlacedCluster,
  type RigView,
  type TopologyFile,
} from "./topology.ts";
export type { PartReach } from "./local-cluster.ts";
export { RUN_COMMAND } from "./run-command.ts";
export { K8S_COMMAND, SWEEP_SITE_CONFIG, genSweep, renderSweep, parseEnvFile } from "./k8s-command.ts";
export { BENCH_LOAD_COMMAND, BENCH_REPORT_COMMAND, BENCH_SLO_COMMAND, BENCH_SWEEP_COMMAND, BENCH_TARGET_CONFIG, benchCommand } from "./bench/bench-command.ts";
export { runLoad, type LoadOptions } from "./bench/load.ts";
export { searchGoodput, type GoodputPoint } from "./bench/goodput.ts";
export { loadSweepConfig, runSweep, sweepPoints, SweepConfigSchema, type SweepConfig, type SweepRow } from "./bench/sweep.ts";
export { parseTrace, readTrace, replayTrace, syntheticTrace, type TraceEntry } from "./bench/trace.ts";
export { lineChart, readSweepRows, writeReport } from "./bench/report.ts";
export { attainment, attains, percentile, resultRow, type RequestRow, type ResultRow, type Slo } from "./bench/stats.ts";
export { sseEvents } from "./bench/sse.ts";
