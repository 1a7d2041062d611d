import { expect, test } from "vitest";
import { BadRequestBody, parseInferenceBody } from "./request-body.ts";

const parse = (v: unknown) => parseInferenceBody(Buffer.from(typeof v === "string" ? v : JSON.stringify(v)));

test("model and prompt from completions and chat bodies", () => {
  expect(parse({ model: "m", prompt: "hello" })).toMatchObject({ model: "m", prompt: "hello" });
  expect(parse({ model: "m", prompt: ["a", "b"] })).toMatchObject({ model: "m", prompt: "a\nb" });
  expect(parse({ model: "m", prompt: [1, 2, 3], cache_salt: "t" })).toEqual({ model: "m", prompt: "1,2,3", tokenize: { model: "m", prompt: [1, 2, 3], cacheSalt: "t" } });
  expect(
    parse({
      model: "m",
      messages: [
        { role: "system", content: "be brief" },
        { role: "user", content: [{ type: "text", text: "hi" }, { type: "image_url" }] },
      ],
    }),
  ).toMatchObject({ model: "m", prompt: "system: be brief\nuser: hi", tokenize: { messages: [{ role: "system" }, { role: "user" }] } });
  expect(parse({ model: "m" })).toEqual({ model: "m", prompt: "", tokenize: { model: "m" } });
});

test("not JSON, not an object, or no model: a 400 naming the problem", () => {
  const err = (v: unknown) => {
    try {
      parse(v);
    } catch (e) {
      return e as BadRequestBody;
    }
    throw new Error("parsed");
  };
  expect(err("{nope").message).toMatch(/not valid JSON/);
  expect(err([1]).message).toMatch(/JSON object/);
  const noModel = err({ prompt: "x" });
  expect(noModel).toBeInstanceOf(BadRequestBody);
  expect([noModel.status, noModel.param, noModel.message]).toEqual([400, "model", "model not found in request body"]);
});
