"""kvq.fallback"""
