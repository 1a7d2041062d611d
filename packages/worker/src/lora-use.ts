// Which LoRA adapters requests wait on and run on, counted by name: what vllm:lora_requests_info
// reports (running_lora_adapters, waiting_lora_adapters), which the Gateway API inference
// extension's picker reads for LoRA affinity.

/** The adapters of requests waiting for a slot and running, counted by name. */
export class LoraUse {
  private readonly waiting = new Map<string, number>();
  private readonly running = new Map<string, number>();

  /** One more request on `name` in `state`; the function given back counts it out (once). */
  enter(name: string, state: "waiting" | "running"): () => void {
    const m = state === "waiting" ? this.waiting : this.running;
    m.set(name, (m.get(name) ?? 0) + 1);
    let left = false;
    return () => {
      if (left) return;
      left = true;
      const n = (m.get(name) ?? 1) - 1;
      if (n > 0) m.set(name, n);
      else m.delete(name);
    };
  }

  names(): { running: string[]; waiting: string[] } {
    return { running: [...this.running.keys()], waiting: [...this.waiting.keys()] };
  }
}
