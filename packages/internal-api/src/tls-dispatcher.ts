// How a caller reaches workers over mutual TLS (AIRM_TLS_DIR): an undici Agent whose connections
// present the part's certificate and verify the worker's against ca.crt (rm-core's
// clientTlsOptions), given to Node's global fetch as its `dispatcher`. One Agent per TLS material
// (and per reload of its files), so every client made with it shares one pool of kept-alive
// connections, as plain calls share the global one. undici is a dependency only for its Agent class: it stays on the major Node
// bundles for its own fetch (7 for Node 24), whose dispatcher interface fetch speaks; a test
// checks the two agree.

import { clientTlsOptions, type TlsMaterial } from "@airm/rm-core";
import { Agent } from "undici";

const agents = new WeakMap<TlsMaterial, { agent: Agent; generation: number }>();

/**
 * The dispatcher of calls made with `tls` (created on first use, shared afterwards). After the
 * material reloaded new files, the next call gets a new Agent whose connections present them; the
 * old one closes once its requests end.
 */
export function tlsDispatcher(tls: TlsMaterial): Agent {
  const cur = agents.get(tls);
  if (cur?.generation === tls.generation) return cur.agent;
  const agent = new Agent({ connect: clientTlsOptions(tls) });
  agents.set(tls, { agent, generation: tls.generation });
  cur?.agent.close().catch(() => {});
  return agent;
}

/**
 * What fetch needs besides the request to reach a part over `tls`: `{ dispatcher }`, or nothing
 * without TLS (the global dispatcher, as before). Spread it into fetch's options.
 */
export function fetchVia(tls: TlsMaterial | undefined): RequestInit {
  return tls ? ({ dispatcher: tlsDispatcher(tls) } as RequestInit) : {};
}
