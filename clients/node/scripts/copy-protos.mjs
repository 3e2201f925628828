// Copies the repository's protos into this package (proto/), so that the
// packed tarball carries the exact contract it was built against. Run by
// `npm run build`. Outside the repository (an installed tarball) the copy
// is already there and nothing is done.
import { copyFileSync, existsSync, mkdirSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
const pkg = join(here, "..");
const repoProto = join(pkg, "..", "..", "proto", "fencelock", "v1");
const out = join(pkg, "proto", "fencelock", "v1");
const files = ["lock.proto", "errors.proto"];

if (!existsSync(join(repoProto, "lock.proto"))) {
  if (files.every((f) => existsSync(join(out, f)))) process.exit(0);
  console.error(`copy-protos: neither ${repoProto} nor ${out} has the protos`);
  process.exit(1);
}
mkdirSync(out, { recursive: true });
for (const f of files) copyFileSync(join(repoProto, f), join(out, f));
