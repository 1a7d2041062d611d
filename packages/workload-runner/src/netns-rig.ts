// A multi-host rig on one machine: each host is a network namespace of its own, held by a
// `sleep` started under `unshare -n` (no named namespaces, no mounts: when the holder dies the
// namespace and its links are gone), joined through a bridge in a "switch" namespace by veth
// pairs with private addresses (10.77.0.0/24 unless the topology says), with `tc tbf` on each
// host's egress and the MTU the topology gives. Nothing is added to the caller's own namespace.
// Needs root (CAP_NET_ADMIN), iproute2 (ip, tc) and util-linux (unshare, nsenter). Used by
// `airm up --topology` (topology.ts) and by the tests and benches through scripts/netns-rig/rig.ts,
// which also has kill() run when a signal stops them (RigOptions.guard).
import { type ChildProcess, execFileSync, spawn, type SpawnOptions } from "node:child_process";
import { readdirSync, readlinkSync } from "node:fs";

/** One host and its link to the switch. `rate`/`burst`/`latency` are tc tbf's; no rate: unshaped. */
export interface HostSpec {
  name: string;
  rate?: string;
  burst?: string;
  latency?: string;
  mtu?: number;
}

/** A star topology: every host on one switch. `link` gives the defaults of every host's link. */
export interface Topology {
  hosts: (string | HostSpec)[];
  link?: Omit<HostSpec, "name">;
  /** The first three octets of the hosts' /24 (default "10.77.0"); hosts get .1, .2, ... */
  subnet?: string;
}

export interface RigHost {
  name: string;
  /** The holder process whose network namespace is the host's. */
  pid: number;
  address: string;
  /** The host's interface to the switch. */
  iface: "eth0";
  link: Omit<HostSpec, "name">;
}

const NAME = /^[a-z][a-z0-9-]{0,30}$/;

/** Checks a topology and fills in each host's link; throws Error naming what is wrong. */
export function resolveTopology(t: Topology): { hosts: (HostSpec & { address: string })[] } {
  if (!Array.isArray(t.hosts) || t.hosts.length < 1 || t.hosts.length > 200) throw new Error("topology.hosts: 1 to 200 hosts");
  const subnet = t.subnet ?? "10.77.0";
  if (!/^(10|192\.168|172\.(1[6-9]|2\d|3[01]))(\.\d{1,3}){1,2}$/.test(subnet) || subnet.split(".").length !== 3)
    throw new Error(`topology.subnet: three octets of a private /24 (e.g. 10.77.0), got ${JSON.stringify(subnet)}`);
  const seen = new Set<string>();
  const hosts = t.hosts.map((h, i) => {
    const spec: HostSpec = typeof h === "string" ? { name: h } : h;
    if (!NAME.test(spec.name)) throw new Error(`topology.hosts[${i}].name: lower-case letters, digits and dashes, got ${JSON.stringify(spec.name)}`);
    if (seen.has(spec.name)) throw new Error(`topology.hosts[${i}].name: ${spec.name} twice`);
    seen.add(spec.name);
    const link = { ...t.link, ...spec };
    if (link.rate !== undefined && !TBF_RATE.test(link.rate)) throw new Error(`topology: ${spec.name}'s rate must be like 1gbit or 100mbit, got ${link.rate}`);
    if (link.mtu !== undefined && !(Number.isInteger(link.mtu) && link.mtu >= 576 && link.mtu <= 65535))
      throw new Error(`topology: ${spec.name}'s mtu must be 576-65535, got ${link.mtu}`);
    return { ...link, name: spec.name, address: `${subnet}.${i + 1}` };
  });
  return { hosts };
}

export interface RigOptions {
  /**
   * The holders and the processes spawn() starts get SIGKILL when this process dies (setpriv
   * --pdeathsig), so that a launcher killed without stopping the rig leaves no namespace behind
   * (airm up --topology).
   */
  dieWithParent?: boolean;
  /**
   * Registers `kill` (kill() below: it returns the pids it signalled) to run if this process is
   * stopped by a signal, and returns what unregisters it: the rig registers it once it is up and
   * unregisters it when down() is done. The tests and benches pass theirs (scripts/netns-rig);
   * airm up stops the rig itself.
   */
  guard?: (kill: () => number[]) => () => void;
}

function holder(o: RigOptions): ChildProcess {
  const cmd = o.dieWithParent ? ["setpriv", "--pdeathsig", "KILL", "sleep", "infinity"] : ["sleep", "infinity"];
  return spawn("unshare", ["-n", ...cmd], { stdio: "ignore" });
}

/** The network namespace of `pid` ("net:[inode]"), or "" once the process is gone. */
function netnsOf(pid: number | string): string {
  try {
    return readlinkSync(`/proc/${pid}/ns/net`);
  } catch {
    return "";
  }
}

/** Pids of every process in one of the network namespaces `nets`. */
function pidsIn(nets: Set<string>): number[] {
  return readdirSync("/proc")
    .filter((x) => /^\d+$/.test(x) && nets.has(netnsOf(x)))
    .map(Number);
}

/** Runs `ip`/`tc`/... in the network namespace of `pid`; returns stdout. */
function inNs(pid: number, cmd: string, args: string[]): string {
  try {
    return execFileSync("nsenter", ["-t", String(pid), "-n", "--", cmd, ...args], { encoding: "utf8", stdio: ["ignore", "pipe", "pipe"] });
  } catch (e) {
    const err = e as { stderr?: string; message: string };
    throw new Error(`${cmd} ${args.join(" ")} (in the namespace of ${pid}): ${(err.stderr ?? err.message).trim()}`);
  }
}

/** Waits until the holder has left the caller's namespace (unshare runs before sleep starts). */
async function settled(p: ChildProcess): Promise<number> {
  const own = execFileSync("readlink", ["/proc/self/ns/net"], { encoding: "utf8" }).trim();
  for (let i = 0; i < 200; i++) {
    if (p.exitCode !== null) throw new Error(`unshare -n exited ${p.exitCode}: creating a network namespace needs root (CAP_NET_ADMIN)`);
    try {
      if (execFileSync("readlink", [`/proc/${p.pid}/ns/net`], { encoding: "utf8" }).trim() !== own) return p.pid!;
    } catch {
      // not there yet
    }
    await new Promise((r) => setTimeout(r, 10));
  }
  throw new Error("unshare -n did not enter a namespace of its own within 2 s");
}

/** tbf's rate: like 1gbit, 100mbit. */
export const TBF_RATE = /^(\d+(?:\.\d+)?)(bit|kbit|mbit|gbit)$/;

/**
 * A tbf burst for `rate`: 256 kB per Gbit/s (at 1 Gbit/s, iperf3 then gets 950 Mbit/s), at least
 * 32 kB. tbf needs at least rate / HZ; a fixed 256 kB would cap a 10 Gbit/s link well below its rate.
 */
export function tbfBurst(rate: string): string {
  const m = TBF_RATE.exec(rate);
  if (!m) throw new Error(`a tbf rate is like 1gbit or 100mbit, got ${JSON.stringify(rate)}`);
  const bits = Number(m[1]) * { bit: 1, kbit: 1e3, mbit: 1e6, gbit: 1e9 }[m[2] as "bit"];
  return `${Math.max(32, Math.round((256 * bits) / 1e9))}kb`;
}

export class NetnsRig {
  readonly hosts: ReadonlyMap<string, RigHost>;
  private readonly holders: ChildProcess[];
  private readonly started: ChildProcess[] = [];
  /** The namespaces of the switch and the hosts, as the holders entered them. */
  private readonly nets: Set<string>;
  private readonly o: RigOptions;
  private unguard = () => {};

  private constructor(hosts: Map<string, RigHost>, holders: ChildProcess[], o: RigOptions) {
    this.hosts = hosts;
    this.holders = holders;
    this.nets = new Set(holders.map((h) => netnsOf(h.pid!)).filter(Boolean));
    this.o = o;
    if (o.guard) this.unguard = o.guard(() => this.kill());
  }

  /** Creates the namespaces, links, addresses and shaping; on any failure removes what it made. */
  static async up(topology: Topology, o: RigOptions = {}): Promise<NetnsRig> {
    const { hosts } = resolveTopology(topology);
    const holders: ChildProcess[] = [];
    try {
      const sw = holder(o);
      holders.push(sw);
      const switchPid = await settled(sw);
      inNs(switchPid, "ip", ["link", "set", "lo", "up"]);
      inNs(switchPid, "ip", ["link", "add", "br0", "type", "bridge"]);
      inNs(switchPid, "ip", ["link", "set", "br0", "up"]);
      const out = new Map<string, RigHost>();
      for (const [i, h] of hosts.entries()) {
        const hp = holder(o);
        holders.push(hp);
        const pid = await settled(hp);
        const port = `p${i}`;
        // made in the switch's namespace, one end moved into the host's: the caller's namespace is never touched
        inNs(switchPid, "ip", ["link", "add", port, "type", "veth", "peer", "name", `h${i}`]);
        inNs(switchPid, "ip", ["link", "set", `h${i}`, "netns", String(pid)]);
        if (h.mtu !== undefined) inNs(switchPid, "ip", ["link", "set", port, "mtu", String(h.mtu)]);
        inNs(switchPid, "ip", ["link", "set", port, "master", "br0", "up"]);
        inNs(pid, "ip", ["link", "set", "lo", "up"]);
        inNs(pid, "ip", ["link", "set", `h${i}`, "name", "eth0"]);
        if (h.mtu !== undefined) inNs(pid, "ip", ["link", "set", "eth0", "mtu", String(h.mtu)]);
        inNs(pid, "ip", ["addr", "add", `${h.address}/24`, "dev", "eth0"]);
        inNs(pid, "ip", ["link", "set", "eth0", "up"]);
        if (h.rate !== undefined)
          inNs(pid, "tc", ["qdisc", "add", "dev", "eth0", "root", "tbf", "rate", h.rate, "burst", h.burst ?? tbfBurst(h.rate), "latency", h.latency ?? "50ms"]);
        const { name, address, ...link } = h;
        out.set(name, { name, pid, address, iface: "eth0", link });
      }
      return new NetnsRig(out, holders, o);
    } catch (e) {
      for (const p of holders) p.kill("SIGKILL");
      throw e;
    }
  }

  host(name: string): RigHost {
    const h = this.hosts.get(name);
    if (!h) throw new Error(`no host ${name} in the rig (hosts: ${[...this.hosts.keys()].join(", ")})`);
    return h;
  }

  /** A command's output, run in `host`'s namespace. */
  sh(host: string, cmd: string, args: string[]): string {
    return inNs(this.host(host).pid, cmd, args);
  }

  /** The command line that runs `cmd` in `host`'s namespace, for a launcher that spawns and stops it itself. */
  command(host: string, cmd: string, args: string[]): string[] {
    return ["nsenter", "-t", String(this.host(host).pid), "-n", "--", cmd, ...args];
  }

  /** Starts a process in `host`'s namespace (stopped by down() if still running). */
  spawn(host: string, cmd: string, args: string[], opts: SpawnOptions = {}): ChildProcess {
    const argv = this.o.dieWithParent ? ["setpriv", "--pdeathsig", "KILL", "--", cmd, ...args] : [cmd, ...args];
    const p = spawn("nsenter", ["-t", String(this.host(host).pid), "-n", "--", ...argv], opts);
    this.started.push(p);
    return p;
  }

  /** Shapes (or re-shapes) a host's egress with tc tbf while the rig runs; "unshaped" removes the qdisc. */
  shape(host: string, rate: string, burst = rate === "unshaped" ? "" : tbfBurst(rate), latency = "50ms"): void {
    if (rate !== "unshaped") this.sh(host, "tc", ["qdisc", "replace", "dev", "eth0", "root", "tbf", "rate", rate, "burst", burst, "latency", latency]);
    else if (/\btbf\b/.test(this.sh(host, "tc", ["qdisc", "show", "dev", "eth0", "root"]))) this.sh(host, "tc", ["qdisc", "del", "dev", "eth0", "root"]);
  }

  /** Cuts or restores a host's link (its eth0), as a pulled cable would. */
  setLink(host: string, up: boolean): void {
    this.sh(host, "ip", ["link", "set", "eth0", up ? "up" : "down"]);
  }

  /** Stops what it started and the holders: the namespaces, links and addresses go with them. */
  async down(): Promise<void> {
    const all = [...this.started, ...this.holders];
    const gone = all.filter((p) => p.exitCode === null && p.signalCode === null).map((p) => new Promise((r) => p.once("exit", r)));
    for (const p of this.started) p.kill("SIGTERM");
    for (const p of this.holders) p.kill("SIGKILL");
    await Promise.race([Promise.all(gone), new Promise((r) => setTimeout(r, 5000))]);
    for (const p of this.started) if (p.exitCode === null && p.signalCode === null) p.kill("SIGKILL");
    this.unguard();
  }

  /**
   * SIGKILLs at once every process in the rig's namespaces (what spawn() started, their children,
   * anything nsenter put there) and the holders, without waiting: the namespaces, links and
   * addresses go with the last of them. Returns the pids signalled. Synchronous, for a teardown
   * on a signal.
   */
  kill(): number[] {
    const holders = this.holders.filter((h) => h.exitCode === null && h.signalCode === null).map((h) => h.pid!);
    const pids = [...new Set([...pidsIn(this.nets), ...holders])];
    for (const pid of pids) {
      try {
        process.kill(pid, "SIGKILL");
      } catch {
        // already gone
      }
    }
    return pids;
  }
}
