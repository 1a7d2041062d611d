// koffi binding to the device-listing subset of FuriosaAI's device-management C library
// (furiosa_smi.h, package furiosa-libsmi, libfuriosa_smi.so): device handles, device info
// (uuid, serial, bdf) and device files. FuriosaAI documents no C ABI for running models on RNGD;
// this library only lists and monitors cards. The engine uses it to map device-plugin ids (uuid,
// serial, bdf) to cards. Struct layouts follow the header (FURIOSA_SMI_MAX_* sizes).

import koffi from "koffi";
import { NativeRuntimeError } from "@airm/engine-kit";

/** What the library reports for one card. */
export interface FuriosaSmiDevice {
  handle: number;
  /** Kernel index from the device files (`/dev/rngd/npu3pe0` -> 3), or null if none parse. */
  index: number | null;
  name: string;
  serial: string;
  uuid: string;
  bdf: string;
  numaNode: number;
  files: { path: string; coreStart: number; coreEnd: number }[];
}

const RETURN_CODES = [
  "OK",
  "INVALID_ARGUMENT_ERROR",
  "NULL_POINTER_ERROR",
  "MAX_BUFFER_SIZE_EXCEED_ERROR",
  "DEVICE_NOT_FOUND_ERROR",
  "DEVICE_BUSY_ERROR",
  "IO_ERROR",
  "PERMISSION_DENIED_ERROR",
  "UNKNOWN_ARCH_ERROR",
  "INCOMPATIBLE_DRIVER_ERROR",
  "UNEXPECTED_VALUE_ERROR",
  "PARSE_ERROR",
  "UNKNOWN_ERROR",
  "INTERNAL_ERROR",
  "UNINITIALIZED_ERROR",
  "CONTEXT_ERROR",
];

interface SmiTypes {
  handles: unknown;
  info: unknown;
  files: unknown;
}
let types: SmiTypes | undefined;

function smiTypes(): SmiTypes {
  if (types) return types;
  const version = koffi.struct("FuriosaSmiVersion", { arch: "int", major: "uint32_t", minor: "uint32_t", patch: "uint32_t", metadata: koffi.array("char", 96, "String") });
  types = {
    handles: koffi.struct("FuriosaSmiDeviceHandles", { count: "uint32_t", device_handles: koffi.array("uint32_t", 64) }),
    info: koffi.struct("FuriosaSmiDeviceInfo", {
      arch: "int",
      core_num: "uint32_t",
      numa_node: "uint32_t",
      name: koffi.array("char", 96, "String"),
      serial: koffi.array("char", 96, "String"),
      uuid: koffi.array("char", 96, "String"),
      bdf: koffi.array("char", 96, "String"),
      major: "uint16_t",
      minor: "uint16_t",
      firmware_version: version,
      driver_version: version,
    }),
    files: koffi.struct("FuriosaSmiDeviceFiles", {
      count: "uint32_t",
      device_files: koffi.array(koffi.struct("FuriosaSmiDeviceFile", { core_start: "uint32_t", core_end: "uint32_t", path: koffi.array("char", 256, "String") }), 64),
    }),
  };
  return types;
}

type Fn = (...args: unknown[]) => number;

/**
 * Lists the cards `libPath` (libfuriosa_smi.so) reports. Calls `furiosa_smi_init` first when the
 * library has it (newer releases). Throws NativeRuntimeError naming the library, the missing
 * symbol or the failing call with its return code name.
 */
export function listFuriosaDevices(libPath: string): FuriosaSmiDevice[] {
  let lib: ReturnType<typeof koffi.load>;
  try {
    lib = koffi.load(libPath);
  } catch (e) {
    throw new NativeRuntimeError("dlopen", `cannot load ${libPath}: ${(e as Error).message}`, { cause: e });
  }
  smiTypes();
  const bind = (proto: string, name: string): Fn => {
    try {
      return lib.func(proto) as unknown as Fn;
    } catch (e) {
      throw new NativeRuntimeError("dlsym", `${libPath} lacks ${name} (${(e as Error).message})`, { cause: e });
    }
  };
  const check = (call: string, rc: number): void => {
    if (rc !== 0) throw new NativeRuntimeError(call, `${RETURN_CODES[rc] ?? `return code ${rc}`} from ${libPath}`);
  };
  let init: Fn | null = null;
  try {
    init = lib.func("int furiosa_smi_init(void)") as unknown as Fn;
  } catch {
    init = null; // releases before furiosa_smi_init need no initialisation call
  }
  if (init) check("furiosa_smi_init", init());
  const getHandles = bind("int furiosa_smi_get_device_handles(_Out_ FuriosaSmiDeviceHandles *out)", "furiosa_smi_get_device_handles");
  const getInfo = bind("int furiosa_smi_get_device_info(uint32_t handle, _Out_ FuriosaSmiDeviceInfo *out)", "furiosa_smi_get_device_info");
  const getFiles = bind("int furiosa_smi_get_device_files(uint32_t handle, _Out_ FuriosaSmiDeviceFiles *out)", "furiosa_smi_get_device_files");
  const handles: { count: number; device_handles: number[] } = { count: 0, device_handles: [] };
  check("furiosa_smi_get_device_handles", getHandles(handles));
  const out: FuriosaSmiDevice[] = [];
  for (const handle of handles.device_handles.slice(0, Math.min(handles.count, 64))) {
    const info = {} as { numa_node: number; name: string; serial: string; uuid: string; bdf: string };
    check("furiosa_smi_get_device_info", getInfo(handle, info));
    const files = {} as { count: number; device_files: { core_start: number; core_end: number; path: string }[] };
    check("furiosa_smi_get_device_files", getFiles(handle, files));
    const list = files.device_files.slice(0, Math.min(files.count, 64)).map((f) => ({ path: f.path, coreStart: f.core_start, coreEnd: f.core_end }));
    const m = list.map((f) => /\/npu(\d+)/.exec(f.path)).find(Boolean);
    out.push({ handle, index: m ? Number(m[1]) : null, name: info.name, serial: info.serial, uuid: info.uuid, bdf: info.bdf, numaNode: info.numa_node, files: list });
  }
  return out;
}

/** Device-plugin id -> kernel index for every uuid, serial and bdf the library reports. */
export function furiosaDeviceIdMap(devices: FuriosaSmiDevice[]): Map<string, number> {
  const map = new Map<string, number>();
  for (const d of devices) {
    if (d.index === null) continue;
    for (const id of [d.uuid, d.serial, d.bdf]) if (id) map.set(id, d.index);
  }
  return map;
}
