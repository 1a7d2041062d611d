// The rig lives in @airm/workload-runner (airm up --topology starts it); this path stays for the
// tests and benches that import it from here. Their rigs die with them: NetnsRig.up here passes
// dieWithParent (the holders and spawned processes get SIGKILL when the test process dies) and a
// guard that kills every process in the rig's namespaces when a signal stops the test process
// (../rig-cleanup.ts), so no namespace, link or process outlives an interrupted run.
import { NetnsRig as PackageRig, type RigOptions, type Topology } from "../../packages/workload-runner/src/netns-rig.ts";
import { onInterrupt, waitGone } from "../rig-cleanup.ts";

export { resolveTopology, TBF_RATE, tbfBurst, type HostSpec, type RigHost, type RigOptions, type Topology } from "../../packages/workload-runner/src/netns-rig.ts";

export type NetnsRig = PackageRig;

export const NetnsRig = {
  /** PackageRig.up, with the rig killed (and waited for) on a signal and dying with this process. */
  up(topology: Topology, o: RigOptions = {}): Promise<PackageRig> {
    const guard = (kill: () => number[]) => onInterrupt(() => waitGone(kill()));
    return PackageRig.up(topology, { dieWithParent: true, guard, ...o });
  },
};
