// scripts/netns-rig: hosts as network namespaces of their own on one switch, with tc tbf shaping
// and MTU per link, reachable from each other and from nothing else; down() leaves nothing, and
// neither does a process running a rig that SIGTERM, SIGINT or SIGHUP stops (its teardown kills
// every process in the rig's namespaces, so the namespaces and their links go; the process then
// dies by the signal). Needs root and iproute2 (CI runs as root); skipped with the reason otherwise.
import { execFileSync } from "node:child_process";
import { existsSync } from "node:fs";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { NetnsRig, resolveTopology } from "../scripts/netns-rig/rig.ts";
import { ended, leftovers, removeRun, type Run, show, startRun } from "./interrupt-helpers.ts";

const why = process.getuid?.() !== 0 ? "needs root (CAP_NET_ADMIN)" : ["/usr/sbin/ip", "/usr/sbin/tc"].some((p) => !existsSync(p)) ? "needs iproute2 (ip, tc)" : null;

describe("topology files", () => {
  it("fill each host's link from the defaults, and refuse bad names, rates, MTUs and subnets by name", () => {
    const t = resolveTopology({ hosts: ["prefill-node", { name: "decode-node", rate: "100mbit" }], link: { rate: "1gbit", mtu: 1400 } });
    expect(t.hosts).toEqual([
      { name: "prefill-node", rate: "1gbit", mtu: 1400, address: "10.77.0.1" },
      { name: "decode-node", rate: "100mbit", mtu: 1400, address: "10.77.0.2" },
    ]);
    expect(() => resolveTopology({ hosts: ["a", "a"] })).toThrow(/a twice/);
    expect(() => resolveTopology({ hosts: ["Bad_Name"] })).toThrow(/hosts\[0\]\.name/);
    expect(() => resolveTopology({ hosts: ["a"], link: { rate: "fast" } })).toThrow(/rate must be like 1gbit/);
    expect(() => resolveTopology({ hosts: ["a"], link: { mtu: 100 } })).toThrow(/mtu must be 576-65535/);
    expect(() => resolveTopology({ hosts: ["a"], subnet: "8.8.8" })).toThrow(/private \/24/);
  });
});

describe.skipIf(why !== null)(`a two-host rig${why ? ` (skipped: ${why})` : ""}`, () => {
  let rig: NetnsRig | undefined;
  afterAll(async () => rig?.down());

  it("gives each host its address, MTU and tbf on its egress, connects them, and adds nothing to this namespace", async () => {
    rig = await NetnsRig.up({ hosts: ["prefill-node", "decode-node"], link: { rate: "1gbit", burst: "256kb", mtu: 1400 } });
    const a = rig.host("prefill-node");
    const b = rig.host("decode-node");
    expect(rig.sh("prefill-node", "ip", ["-o", "-4", "addr", "show", "dev", "eth0"])).toContain(`${a.address}/24`);
    expect(rig.sh("decode-node", "ip", ["-o", "link", "show", "dev", "eth0"])).toMatch(/mtu 1400/);
    expect(rig.sh("decode-node", "tc", ["qdisc", "show", "dev", "eth0"])).toMatch(/tbf .*rate 1Gbit/);
    // this process's namespace has none of the rig's addresses or links
    const own = execFileSync("ip", ["-o", "addr"], { encoding: "utf8" });
    expect(own).not.toContain("10.77.0.");
    // a TCP echo from one host to the other through the switch
    const server = rig.spawn("prefill-node", process.execPath, [
      "-e",
      `require("node:net").createServer((s) => s.pipe(s)).listen(7070, "${a.address}", () => console.log("listening"))`,
    ]);
    await new Promise<void>((resolve, reject) => {
      server.stdout!.once("data", () => resolve());
      server.once("exit", (c) => reject(new Error(`echo server exited ${c}`)));
    });
    const reply = rig.sh("decode-node", process.execPath, [
      "-e",
      `const s = require("node:net").connect(7070, "${a.address}", () => s.end("across the rig")); s.on("data", (d) => process.stdout.write(d));`,
    ]);
    expect(reply).toBe("across the rig");
    // and a cut link is a refused connection, not a hang
    rig.setLink("decode-node", false);
    expect(() =>
      rig!.sh("decode-node", process.execPath, [
        "-e",
        `const s = require("node:net").connect(7070, "${a.address}"); s.on("error", (e) => { console.error(e.code); process.exit(3); });`,
      ]),
    ).toThrow(/ENETUNREACH|EHOSTUNREACH/);
    rig.setLink("decode-node", true);
    expect(b.address).toBe("10.77.0.2");
  });

  it("down() stops the processes and holders, so the namespaces and links are gone", async () => {
    const r = rig!;
    const pids = [...r.hosts.values()].map((h) => h.pid);
    await r.down();
    rig = undefined;
    for (const pid of pids) expect(existsSync(`/proc/${pid}`)).toBe(false);
  });
});

interface NetnsRun {
  holders: number[];
  nets: string[];
  shell: number;
  grandchild: number;
}

/** Starts test/fixtures/netns-rig-run.ts and resolves with what it printed once its rig is up. */
async function startNetnsRun(marker: string): Promise<{ run: Run; s: NetnsRun }> {
  const run = startRun(process.execPath, ["--import", "tsx", join(import.meta.dirname, "fixtures", "netns-rig-run.ts"), marker]);
  for (let i = 0; i < 300 && !run.out().includes("\n") && run.proc.exitCode === null; i++) await new Promise((r) => setTimeout(r, 100));
  if (!run.out().includes("\n")) throw new Error(`the rig did not come up: ${run.err()}`);
  return { run, s: JSON.parse(run.out()) };
}

describe.skipIf(why !== null)(`a process running a rig, stopped by a signal${why ? ` (skipped: ${why})` : ""}`, () => {
  it.each(["SIGTERM", "SIGINT", "SIGHUP"] as const)(
    "on %s leaves no process in the rig's namespaces, so no namespace or link, and dies by the signal",
    async (signal) => {
      const marker = `airm-netns-interrupt-${process.pid}-${signal}`;
      let run: Run | undefined;
      let s: NetnsRun | undefined;
      try {
        ({ run, s } = await startNetnsRun(marker));
        const q = { pids: [...s.holders, s.shell, s.grandchild], markers: [marker], nets: s.nets };
        expect(s.holders).toHaveLength(3);
        expect(leftovers(q).length).toBeGreaterThanOrEqual(s.holders.length + 2);
        run.proc.kill(signal);
        expect(await ended(run, 30_000)).toEqual({ code: null, signal });
        // unnamed namespaces (no bind mount holds them) end with their last process, and their links with them
        expect(show(leftovers(q))).toEqual([]);
      } finally {
        removeRun(run, { pids: s ? [...s.holders, s.shell, s.grandchild] : [], markers: [marker], nets: s?.nets ?? [] }, []);
      }
    },
    60_000,
  );
});
