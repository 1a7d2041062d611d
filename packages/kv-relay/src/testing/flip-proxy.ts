// A TCP proxy that flips one byte of a relay connection's stream, for fault tests of anything
// that talks to a relay (the tcp transport, nixl-ucx's descriptors).

import { once } from "node:events";
import net from "node:net";

export interface FlipProxy {
  address: string;
  close(): Promise<void>;
}

/**
 * A TCP proxy to `target` that XORs the byte at stream offset `at` of the first connection, in the
 * client-to-relay direction ("up") or relay-to-client ("down"), with 0xff. Everything else passes through.
 */
export async function startFlipProxy(target: { host: string; port: number }, direction: "up" | "down", at: number): Promise<FlipProxy> {
  let flipped = false;
  const sockets = new Set<net.Socket>();
  const flipper = () => {
    let seen = 0;
    return (chunk: Buffer): Buffer => {
      if (!flipped && at >= seen && at < seen + chunk.length) {
        chunk[at - seen] ^= 0xff;
        flipped = true;
      }
      seen += chunk.length;
      return chunk;
    };
  };
  const server = net.createServer((client) => {
    const upstream = net.connect(target.port, target.host);
    sockets.add(client).add(upstream);
    const up = direction === "up" ? flipper() : (c: Buffer) => c;
    const down = direction === "down" ? flipper() : (c: Buffer) => c;
    client.on("data", (c: Buffer) => upstream.write(up(c)));
    upstream.on("data", (c: Buffer) => client.write(down(c)));
    const end = () => {
      client.destroy();
      upstream.destroy();
    };
    client.on("close", end).on("error", end);
    upstream.on("close", end).on("error", end);
  });
  server.listen(0, "127.0.0.1");
  await once(server, "listening");
  return {
    address: `127.0.0.1:${(server.address() as net.AddressInfo).port}`,
    async close() {
      for (const s of sockets) s.destroy();
      await new Promise((r) => server.close(r));
    },
  };
}
