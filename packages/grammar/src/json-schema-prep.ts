// Readies a JSON schema for the grammar engine: refuses, by keyword and place, what xgrammar
// 0.1.27 would accept and not enforce (so an answer could break the schema without anyone being
// told), and takes numeric ranges out of its hands (it builds them wrongly, see number-range.ts):
// each ranged integer/number becomes a marker string that the grammar thread swaps for our rule.
// Knows JSON Schema's keyword layout; nothing of tokens.

import { randomBytes } from "node:crypto";
import { GrammarError } from "@airm/rm-core";
import { numberRangeRules } from "./number-range.ts";

/** A rule that takes the place of a marker literal in the grammar xgrammar prints. */
export interface Splice {
  /** The marker exactly as xgrammar prints the const string: `"\"\\u0001airm-...\""`. */
  literal: string;
  rule: string;
  rules: string[];
}

export interface PreparedSchema {
  /** The schema text to convert, ranged numbers replaced by marker consts. */
  schema: string;
  splices: Splice[];
}

/** Keywords whose value is one schema. */
const ONE = ["items", "additionalProperties", "additionalItems", "unevaluatedItems", "unevaluatedProperties"];
/** Keywords whose value is a list of schemas. */
const LIST = ["anyOf", "oneOf", "allOf", "prefixItems"];
/** Keywords whose value maps names to schemas. */
const MAP = ["properties", "$defs", "definitions"];

/** Keywords the engine accepts but does not enforce: refused so that no answer breaks them unseen. */
const UNENFORCED = new Map<string, string>([
  ["multipleOf", "multipleOf"],
  ["contains", "contains"],
  ["minContains", "minContains"],
  ["maxContains", "maxContains"],
  ["patternProperties", "patternProperties"],
  ["propertyNames", "propertyNames"],
  ["not", "not"],
  ["if", "if/then/else"],
  ["then", "if/then/else"],
  ["else", "if/then/else"],
  ["dependentRequired", "dependentRequired"],
  ["dependentSchemas", "dependentSchemas"],
  ["dependencies", "dependencies"],
]);

const BOUNDS = ["minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"];

type Json = null | boolean | number | string | Json[] | { [k: string]: Json };
type Obj = { [k: string]: Json };

const isObj = (v: unknown): v is Obj => typeof v === "object" && v !== null && !Array.isArray(v);

class Prep {
  readonly splices: Splice[] = [];
  private readonly nonce = randomBytes(4).toString("hex");

  constructor(private readonly param: string) {}

  fail(pointer: string, message: string): never {
    throw new GrammarError(`${this.param}${pointer ? ` at ${pointer}` : ""}: ${message}`, { param: this.param, invalid: true });
  }

  schema(s: Json, pointer: string): Json {
    if (typeof s === "boolean") return s;
    if (!isObj(s)) this.fail(pointer, "a schema must be an object or a boolean");
    for (const k of Object.keys(s)) {
      const name = UNENFORCED.get(k);
      if (name === undefined) continue;
      this.fail(`${pointer}/${k}`, `'${name}' is not enforced by this server's grammar engine (xgrammar); remove it or express it another way`);
    }
    if (s.uniqueItems === true) this.fail(`${pointer}/uniqueItems`, "'uniqueItems' is not enforced by this server's grammar engine (xgrammar); remove it");
    if (Array.isArray(s.allOf) && s.allOf.length > 1)
      this.fail(`${pointer}/allOf`, "'allOf' with more than one schema is not enforced by this server's grammar engine (xgrammar); merge them into one");
    for (const k of ["unevaluatedItems", "unevaluatedProperties"]) {
      if (k in s && s[k] !== false) this.fail(`${pointer}/${k}`, `'${k}' other than false is not enforced by this server's grammar engine (xgrammar)`);
    }
    const out: Obj = { ...s };
    for (const k of ONE) if (k in s && !Array.isArray(s[k])) out[k] = this.schema(s[k], `${pointer}/${k}`);
    if (Array.isArray(s.items)) out.items = s.items.map((x, i) => this.schema(x, `${pointer}/items/${i}`));
    for (const k of LIST) {
      if (!(k in s)) continue;
      const list = s[k];
      if (!Array.isArray(list)) this.fail(`${pointer}/${k}`, `'${k}' must be a list of schemas`);
      out[k] = list.map((x, i) => this.schema(x, `${pointer}/${k}/${i}`));
    }
    for (const k of MAP) {
      if (!(k in s)) continue;
      const map = s[k];
      if (!isObj(map)) this.fail(`${pointer}/${k}`, `'${k}' must map names to schemas`);
      out[k] = Object.fromEntries(Object.entries(map).map(([name, x]) => [name, this.schema(x, `${pointer}/${k}/${escapePointer(name)}`)]));
    }
    return BOUNDS.some((k) => k in s) ? this.ranged(out, pointer) : out;
  }

  /** A subschema with numeric bounds: its numbers become a marker the thread replaces with our rule. */
  private ranged(s: Obj, pointer: string): Json {
    const types = typeof s.type === "string" ? [s.type] : Array.isArray(s.type) ? s.type.filter((t): t is string => typeof t === "string") : [];
    const numeric = types.filter((t) => t === "integer" || t === "number");
    if (numeric.length === 0) this.fail(pointer, "numeric bounds (minimum, maximum, exclusiveMinimum, exclusiveMaximum) need 'type' integer or number");
    const rest: Obj = { ...s };
    for (const k of BOUNDS) delete rest[k];
    if ("enum" in s || "const" in s) return rest; // the listed values are what may come
    const num = (k: string): number | undefined => {
      const v = s[k];
      if (v === undefined || typeof v === "boolean") return undefined;
      if (typeof v !== "number") this.fail(`${pointer}/${k}`, `'${k}' must be a number`);
      return v;
    };
    // exclusiveMinimum/Maximum: a number (2019+), or a draft-4 boolean that makes minimum/maximum exclusive.
    const lower = [num("minimum"), num("exclusiveMinimum")];
    const upper = [num("maximum"), num("exclusiveMaximum")];
    const pickLower = lower[1] !== undefined && (lower[0] === undefined || lower[1] >= lower[0]);
    const pickUpper = upper[1] !== undefined && (upper[0] === undefined || upper[1] <= upper[0]);
    const index = this.splices.length;
    const rule = `airm_r${index}`;
    let rules: string[];
    try {
      rules = numberRangeRules(
        rule,
        {
          integer: !numeric.includes("number"),
          minimum: pickLower ? lower[1] : lower[0],
          maximum: pickUpper ? upper[1] : upper[0],
          exclusiveMinimum: pickLower || s.exclusiveMinimum === true,
          exclusiveMaximum: pickUpper || s.exclusiveMaximum === true,
        },
        `${this.param} at ${pointer || "/"}`,
      );
    } catch (e) {
      throw new GrammarError((e as Error).message, { param: this.param, invalid: true });
    }
    const marker = `\u0001airm-${this.nonce}-${index}`;
    this.splices.push({ literal: JSON.stringify(JSON.stringify(marker)), rule, rules });
    const others = types.filter((t) => t !== "integer" && t !== "number");
    if (others.length === 0) return { const: marker };
    delete rest.type;
    return { anyOf: [{ const: marker }, { ...rest, type: others.length === 1 ? others[0] : others }] };
  }
}

function escapePointer(name: string): string {
  return name.replaceAll("~", "~0").replaceAll("/", "~1");
}

/**
 * Checks and rewrites `schema` (parsed JSON) for the grammar engine. `param` names the request
 * field in errors. Throws GrammarError (invalid) naming the keyword and its place.
 */
export function prepareJsonSchema(schema: unknown, param: string): PreparedSchema {
  const prep = new Prep(param);
  const out = prep.schema(schema as Json, "");
  return { schema: JSON.stringify(out), splices: prep.splices };
}
