//! Workloads, the OpenAI streaming client and the stage runner that turns a scenario into request records
