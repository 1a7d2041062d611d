// @airm/workload-runner: the rngd-pd workload runner and the local cluster behind `airm up`.
export { run, buildCommand, rngdPdWorkload, RunConfigSchema, type RunConfig, type ProcessCommand } from "./rngd-pd-workload.ts";
export { binPath } from "./package-bins.ts";
export { startLocalCluster, sweepStaleShmFolders, type UpOptions, type RunningCluster } from "./local-cluster.ts";
export { chooseDefaultModel, type ChosenModel } from "./default-model.ts";
