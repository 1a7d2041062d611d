// The Berkeley Function Calling Leaderboard's single-turn AST cases from PyPI's bfcl-eval wheel:
// fetched once with pip (no dependencies), its data files taken out with Python's zipfile, and
// cached next to the model cache (~/.cache/airm/bfcl-eval-<version>). Each case becomes an OpenAI
// chat request the way BFCL's OpenAI handler builds one (model_handler/utils.py convert_to_tool
// after utils.py _func_doc_language_specific_pre_processing). Scoring is bfcl-checker.ts's.
import { execFileSync } from "node:child_process";
import { existsSync, mkdirSync, mkdtempSync, readFileSync, renameSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { defaultCacheDir } from "../../packages/llama/src/model-cache/model-cache.ts";
import { type FunctionDoc, loadsPy, type Py } from "./bfcl-checker.ts";

export const BFCL_VERSION = "2026.3.23";
/** The AST categories the bench can run (BFCL_v4_<category>.json; all but irrelevance have a possible_answer file). */
export const BFCL_CATEGORIES = ["simple_python", "multiple", "parallel", "parallel_multiple", "irrelevance"] as const;
export type BfclCategory = (typeof BFCL_CATEGORIES)[number];

export interface BfclCase {
  id: string;
  category: BfclCategory;
  /** The first (only) turn's messages. */
  messages: { role: string; content: string }[];
  /** The functions as the checker reads them (BFCL's types; descriptions with the Python hint). */
  functions: FunctionDoc[];
  /** The request's `tools`. */
  tools: OpenAiTool[];
  /** [{name: {param: [accepted values]}}, ...]; null for irrelevance. */
  groundTruth: Py[] | null;
}

export interface OpenAiTool {
  type: "function";
  function: { name: string; description: string; parameters: Record<string, unknown> };
}

const dataFile = (category: string) => `bfcl_eval/data/BFCL_v4_${category}.json`;
const answerFile = (category: string) => `bfcl_eval/data/possible_answer/BFCL_v4_${category}.json`;

/** The folder holding the data files (bfcl_eval/data/...), downloaded and unpacked on first use. Throws when pip fails. */
export function ensureBfclData(): string {
  const root = join(dirname(defaultCacheDir(process.env)), `bfcl-eval-${BFCL_VERSION}`);
  const wanted = BFCL_CATEGORIES.flatMap((c) => (c === "irrelevance" ? [dataFile(c)] : [dataFile(c), answerFile(c)]));
  if (wanted.every((f) => existsSync(join(root, f)))) return root;
  console.log(`bfcl: fetching bfcl-eval==${BFCL_VERSION} from PyPI into ${root} (once)`);
  const work = mkdtempSync(join(tmpdir(), "airm-bfcl-"));
  try {
    execFileSync("python3", ["-m", "pip", "download", "--no-deps", "--quiet", "-d", work, `bfcl-eval==${BFCL_VERSION}`], { stdio: "inherit" });
    const unpack = "import sys, zipfile, glob\nz = zipfile.ZipFile(glob.glob(sys.argv[1] + '/bfcl_eval-*.whl')[0])\nfor m in sys.argv[3:]: z.extract(m, sys.argv[2])";
    execFileSync("python3", ["-c", unpack, work, join(work, "out"), ...wanted], { stdio: "inherit" });
    mkdirSync(dirname(root), { recursive: true });
    rmSync(root, { recursive: true, force: true });
    renameSync(join(work, "out"), root);
  } finally {
    rmSync(work, { recursive: true, force: true });
  }
  return root;
}

/** BFCL's types as OpenAPI names them (constants/type_mappings.py GORILLA_TO_OPENAPI, the Python part). */
const GORILLA_TO_OPENAPI: Record<string, string> = {
  integer: "integer",
  number: "number",
  float: "number",
  string: "string",
  boolean: "boolean",
  bool: "boolean",
  array: "array",
  list: "array",
  dict: "object",
  object: "object",
  tuple: "array",
  any: "string",
};
const mapType = (t: unknown) => GORILLA_TO_OPENAPI[String(t)] ?? "string";

type Schema = Record<string, any>;

/** _cast_to_openai_type: a properties map with OpenAPI types (float also says so, as BFCL writes it). */
function castProperties(properties: Record<string, Schema>): Record<string, Schema> {
  for (const value of Object.values(properties)) {
    if (!("type" in value)) value.type = "string";
    else {
      if (value.type === "float") {
        value.format = "float";
        value.description = `${value.description ?? ""} This is a float type value.`;
      }
      value.type = mapType(value.type);
    }
    if (value.type === "array" || value.type === "object") {
      if (value.properties) value.properties = castProperties(value.properties);
      else if (value.items) {
        value.items.type = mapType(value.items.type);
        if (value.items.type === "array" && value.items.items) value.items.items.type = mapType(value.items.items.type);
        else if (value.items.type === "object" && value.items.properties) value.items.properties = castProperties(value.items.properties);
      }
    }
  }
  return properties;
}

/** convert_to_tool for OpenAI's chat completions: dots in names become underscores, the parameters an object schema. */
export function toOpenAiTools(functions: FunctionDoc[]): OpenAiTool[] {
  return functions.map((f) => {
    const parameters = structuredClone(f.parameters) as Schema;
    parameters.type = "object";
    parameters.properties = castProperties(parameters.properties);
    return { type: "function", function: { name: f.name.replaceAll(".", "_"), description: f.description ?? "", parameters } };
  });
}

/** The Python hint BFCL appends to every function's description (_func_doc_language_specific_pre_processing). */
const PYTHON_HINT = " Note that the provided function is in Python 3 syntax.";

const readLines = (path: string) =>
  readFileSync(path, "utf8")
    .split("\n")
    .filter((l) => l.trim());

/**
 * The first `perCategory` cases of each category, in the files' order. Each question must be one
 * turn (true of these categories).
 */
export function loadCases(root: string, categories: readonly BfclCategory[], perCategory: number): BfclCase[] {
  const out: BfclCase[] = [];
  for (const category of categories) {
    const entries = readLines(join(root, dataFile(category)))
      .slice(0, perCategory)
      .map((l) => JSON.parse(l) as { id: string; question: { role: string; content: string }[][]; function: FunctionDoc[] });
    const answers = new Map<string, Py[]>();
    if (category !== "irrelevance") {
      for (const l of readLines(join(root, answerFile(category)))) {
        const a = loadsPy(l);
        if (a.t !== "dict") continue;
        const id = a.v.get("id");
        const gt = a.v.get("ground_truth");
        if (id?.t === "str" && gt?.t === "list") answers.set(id.v, gt.v);
      }
    }
    for (const e of entries) {
      if (e.question.length !== 1) throw new Error(`${e.id}: ${e.question.length} turns; the bench sends single-turn cases`);
      const functions = e.function.map((f) => ({ ...f, description: `${f.description ?? ""}${PYTHON_HINT}` }));
      const groundTruth = category === "irrelevance" ? null : (answers.get(e.id) ?? null);
      if (category !== "irrelevance" && !groundTruth) throw new Error(`${e.id}: no possible answer in ${answerFile(category)}`);
      out.push({ id: e.id, category, messages: e.question[0], functions, tools: toOpenAiTools(functions), groundTruth });
    }
  }
  return out;
}
