// @airm/kv-tcp: the `tcp` KV transport (blobs through an airm-kv-relay, from @airm/kv-relay).
export { tcpTransport, createTcpTransport, TCP_SUPPORT, TCP_CONFIG, type TcpOptions } from "./tcp-transport.ts";
