// The rig lives in @airm/workload-runner (airm up --topology starts it); this path stays for the
// tests and benches that import it from here.
export { NetnsRig, resolveTopology, TBF_RATE, tbfBurst, type HostSpec, type RigHost, type RigOptions, type Topology } from "../../packages/workload-runner/src/netns-rig.ts";
