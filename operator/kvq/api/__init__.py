"""kvq.api"""
