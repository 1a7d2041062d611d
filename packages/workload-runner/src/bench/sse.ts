// The events of an OpenAI server-sent-event stream: each `data:` line's JSON, in order, without
// the closing `[DONE]` (`o.onDone` hears it), typed as the caller says (unchecked). Throws
// (SyntaxError) on a data line that is not JSON.

export async function* sseEvents<T = unknown>(body: ReadableStream<Uint8Array>, o: { onDone?(): void } = {}): AsyncGenerator<T> {
  const reader = body.getReader();
  const dec = new TextDecoder();
  let buf = "";
  try {
    for (;;) {
      const { done, value } = await reader.read();
      if (done) return;
      buf += dec.decode(value, { stream: true });
      let i = buf.indexOf("\n\n");
      while (i >= 0) {
        const event = buf.slice(0, i);
        buf = buf.slice(i + 2);
        i = buf.indexOf("\n\n");
        for (const line of event.split("\n")) {
          if (!line.startsWith("data:")) continue;
          const data = line.slice(5).trim();
          if (data === "[DONE]") o.onDone?.();
          else yield JSON.parse(data) as T;
        }
      }
    }
  } finally {
    reader.cancel().catch(() => {});
  }
}
