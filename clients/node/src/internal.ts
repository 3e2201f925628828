// Internals exposed for this package's own tests (not part of the API:
// not in package.json "exports").
export * from "./retry.js";
export * from "./router.js";
export * from "./config.js";
export * from "./errors.js";
export * from "./proto.js";
export * from "./lease.js";
export * from "./watch.js";
