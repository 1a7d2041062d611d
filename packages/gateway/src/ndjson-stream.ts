// Reads a worker's NDJSON event stream (one JSON object per line) with an idle timeout between
// events. Knows the framing only; the meaning of events is the orchestrator's.

export class StreamIdleError extends Error {
  constructor(readonly idleMs: number) {
    super(`no event for ${idleMs} ms`);
  }
}

/** Yields each JSON line of `body`. Throws StreamIdleError when no line arrives within `idleMs`. */
export async function* readNdjson(body: ReadableStream<Uint8Array>, idleMs: number): AsyncGenerator<Record<string, unknown>> {
  const reader = body.getReader();
  const decoder = new TextDecoder();
  let buf = "";
  try {
    for (;;) {
      let timer: NodeJS.Timeout | undefined;
      const idle = new Promise<never>((_, reject) => {
        timer = setTimeout(() => reject(new StreamIdleError(idleMs)), idleMs);
      });
      let chunk: Awaited<ReturnType<typeof reader.read>>;
      try {
        chunk = await Promise.race([reader.read(), idle]);
      } finally {
        clearTimeout(timer);
      }
      if (chunk.done) break;
      buf += decoder.decode(chunk.value, { stream: true });
      let nl: number;
      while ((nl = buf.indexOf("\n")) >= 0) {
        const line = buf.slice(0, nl).trim();
        buf = buf.slice(nl + 1);
        if (line) yield JSON.parse(line) as Record<string, unknown>;
      }
    }
    const rest = (buf + decoder.decode()).trim();
    if (rest) yield JSON.parse(rest) as Record<string, unknown>;
  } finally {
    reader.cancel().catch(() => {});
  }
}
