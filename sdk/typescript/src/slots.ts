/**
 * Execution slots: at most `capacity` handlers execute at once; the rest
 * wait in FIFO order.
 *
 * @packageDocumentation
 */

interface Waiter {
  grant(): void;
}

/** A FIFO counting semaphore whose waits end early when a signal aborts. */
export class Slots {
  private free: number;
  private readonly waiters: Waiter[] = [];

  /** @param capacity the number of slots. */
  constructor(readonly capacity: number) {
    this.free = capacity;
  }

  /** Slots held now. */
  get inUse(): number {
    return this.capacity - this.free;
  }

  /** Attempts waiting for a slot. */
  get waiting(): number {
    return this.waiters.length;
  }

  /**
   * Waits for a slot, in arrival order. Resolves `true` holding a slot (give
   * it back with {@link release}), or `false` if `signal` aborted first.
   */
  acquire(signal: AbortSignal): Promise<boolean> {
    if (signal.aborted) return Promise.resolve(false);
    if (this.free > 0 && this.waiters.length === 0) {
      this.free--;
      return Promise.resolve(true);
    }
    return new Promise<boolean>((resolve) => {
      const onAbort = () => {
        const i = this.waiters.indexOf(waiter);
        if (i >= 0) this.waiters.splice(i, 1);
        resolve(false);
      };
      const waiter: Waiter = {
        grant: () => {
          signal.removeEventListener("abort", onAbort);
          resolve(true);
        },
      };
      signal.addEventListener("abort", onAbort, { once: true });
      this.waiters.push(waiter);
    });
  }

  /** Gives a slot back: straight to the first waiter, if any. */
  release(): void {
    const next = this.waiters.shift();
    if (next) next.grant();
    else this.free = Math.min(this.capacity, this.free + 1);
  }
}
