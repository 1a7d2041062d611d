// A seeded random stream (mulberry32), so two runs with the same seed send the same requests at
// the same offsets: prompt token ids and Poisson inter-arrival gaps.

export class Rng {
  private state: number;

  constructor(seed: number) {
    this.state = seed >>> 0;
  }

  /** Uniform in [0, 1). */
  next(): number {
    this.state = (this.state + 0x6d2b79f5) >>> 0;
    let t = this.state;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  }

  /** An integer in [lo, hi). */
  int(lo: number, hi: number): number {
    return lo + Math.floor(this.next() * (hi - lo));
  }

  /** An exponential gap with mean 1/rate (Poisson arrivals at `rate` per second), in ms. */
  gapMs(rate: number): number {
    return (-Math.log(1 - this.next()) / rate) * 1000;
  }
}
