-- The contract's `shop` database (section 1). Created by `lakehouse dev source start` (dev/lakehouse_dev/pg_source.py)
-- and, in docker/compose.yaml, by the postgres image's init scripts.
CREATE TABLE IF NOT EXISTS customers (
  id          bigint PRIMARY KEY,
  email       text        NOT NULL,
  full_name   text        NOT NULL,
  country     char(2)     NOT NULL,
  created_at  timestamptz NOT NULL,
  updated_at  timestamptz NOT NULL
);
CREATE TABLE IF NOT EXISTS orders (
  id          bigint PRIMARY KEY,
  customer_id bigint      NOT NULL,
  status      text        NOT NULL,
  amount      numeric(12,2) NOT NULL,
  currency    char(3)     NOT NULL,
  created_at  timestamptz NOT NULL,
  updated_at  timestamptz NOT NULL
);
ALTER TABLE customers REPLICA IDENTITY DEFAULT;
ALTER TABLE orders REPLICA IDENTITY DEFAULT;
