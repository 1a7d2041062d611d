// @airm/epp/testing: what tests and benches of the picker (or of anything that talks ext_proc)
// need: a client that plays Envoy, fake model servers serving /metrics, and a fixed-answer
// ext_proc server as a round-trip reference.
export { EnvoyStub, ExtProcStream, type RequestAnswer, type StubRequest } from "./envoy-stub.ts";
export { startFakeModelServer, metricsText, type FakeModelServer } from "./fake-model-server.ts";
export { startFixedExtProc, type FixedExtProc } from "./fixed-ext-proc.ts";
export { RawExtProcClient, encodeRequest, type EncodedRequest, type RawAnswer } from "./raw-ext-proc-client.ts";
