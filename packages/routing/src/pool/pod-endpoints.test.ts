import { expect, test } from "vitest";
import { labelSelectorText, podEndpoints, podIsServing, poolSpecOf, roleOfPod, type PodLike } from "./pod-endpoints.ts";

const pod = (over: { name?: string; labels?: Record<string, string>; phase?: string; ip?: string; ready?: string; deleting?: boolean } = {}): PodLike => ({
  metadata: { name: over.name ?? "p", labels: over.labels ?? {}, ...(over.deleting ? { deletionTimestamp: new Date() } : {}) },
  status: {
    phase: over.phase ?? "Running",
    podIP: over.ip ?? "10.0.0.7",
    conditions: [
      { type: "Initialized", status: "True" },
      { type: "Ready", status: over.ready ?? "True" },
    ],
  },
});

test("a pod serves when Running, with an IP, Ready and not being deleted", () => {
  expect(podIsServing(pod())).toBe(true);
  expect(podIsServing(pod({ phase: "Pending" }))).toBe(false);
  expect(podIsServing(pod({ ip: "" }))).toBe(false);
  expect(podIsServing(pod({ ready: "False" }))).toBe(false);
  expect(podIsServing(pod({ deleting: true }))).toBe(false);
  expect(podIsServing({ metadata: { name: "x" } })).toBe(false);
});

test("the role comes from llm-d.ai/role; absent is both, unknown is not routed", () => {
  expect(roleOfPod(pod())).toBe("both");
  expect(roleOfPod(pod({ labels: { "llm-d.ai/role": "prefill" } }))).toBe("prefill");
  expect(roleOfPod(pod({ labels: { "llm-d.ai/role": "decode" } }))).toBe("decode");
  expect(roleOfPod(pod({ labels: { "llm-d.ai/role": "encode" } }))).toBeNull();
  expect(podEndpoints(pod({ labels: { "llm-d.ai/role": "encode" } }), [8000])).toEqual([]);
});

test("one endpoint per target port; none for a pod that is not serving", () => {
  expect(podEndpoints(pod({ name: "a", labels: { "llm-d.ai/role": "decode" } }), [8000])).toEqual([{ address: "10.0.0.7", port: 8000, role: "decode", name: "a" }]);
  expect(podEndpoints(pod({ name: "a" }), [8000, 8001]).map((e) => `${e.name}@${e.port}`)).toEqual(["a-rank-0@8000", "a-rank-1@8001"]);
  expect(podEndpoints(pod({ ready: "False" }), [8000])).toEqual([]);
});

test("an InferencePool's spec gives the selector and ports; a malformed one is an error", () => {
  const pool = { apiVersion: "inference.networking.k8s.io/v1", kind: "InferencePool", spec: { selector: { matchLabels: { b: "2", a: "1" } }, targetPorts: [{ number: 8000 }] } };
  const spec = poolSpecOf(pool);
  expect(spec).toEqual({ selector: { a: "1", b: "2" }, targetPorts: [8000] });
  expect(labelSelectorText(spec.selector)).toBe("a=1,b=2");
  expect(() => poolSpecOf({ spec: { selector: { matchLabels: {} }, targetPorts: [{ number: 8000 }] } })).toThrow(/matchLabels/);
  expect(() => poolSpecOf({ spec: { selector: { matchLabels: { a: "1" } }, targetPorts: [{ number: 0 }] } })).toThrow(/targetPorts/);
});
