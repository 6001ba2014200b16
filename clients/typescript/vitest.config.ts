import { defineConfig } from "vitest/config";

export default defineConfig({
  test: {
    include: ["test/**/*.test.ts"],
    // The auto-resume tests run a real WebSocket server on loopback; a wedged one must fail, not hang.
    testTimeout: 10_000,
  },
});
