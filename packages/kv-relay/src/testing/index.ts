// @airm/kv-relay/testing: fault-injection helpers for tests of relay users.
export { startFlipProxy, type FlipProxy } from "./flip-proxy.ts";
